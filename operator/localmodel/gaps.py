"""The cluster's own gaps, said up front (issue 31): a model whose image cannot
be pulled, whose weights claim has no StorageClass to bind it, or whose pod the
scheduler left Unschedulable is `Ready=False` with the reason and the setting
to change, in its status within a pass, not only on the pod. Pure: reduced
objects in, at most one `Gap` per model out; the operator (controller/model_work.py)
and `doctor` both ask `model_gap`.

What is read, and where it comes from:

- the kubelet's waiting reasons for an image it cannot pull, in a container's
  `status.containerStatuses[].state.waiting` (and initContainerStatuses):
  ErrImagePull, ImagePullBackOff, InvalidImageName, ErrImageNeverPull,
  ImageInspectError (kubernetes pkg/kubelet/images/types.go);
- a claim's `spec.storageClassName` and whether it is bound
  (`spec.volumeName`); StorageClasses by name, the default ones by the
  annotation `storageclass.kubernetes.io/is-default-class: "true"` (or its
  beta spelling): a claim created without a class gets the default one written
  by the DefaultStorageClass admission plugin, or later, once a default exists
  (retroactive default assignment, Kubernetes 1.28+);
- the scheduler's message on a pod's `PodScheduled=False/Unschedulable`;
- a container that keeps failing (`failing_containers`), init containers and
  native sidecars included: its `state.waiting` reason other than the ones
  of a container being made (CrashLoopBackOff, CreateContainerConfigError,
  RunContainerError...), or a `state`/`lastState.terminated` that failed
  (exit code not 0, or OOMKilled), with its `restartCount` and its last
  message (the termination's message, else the waiting one).

Every string from the cluster is bounded and cleaned (`printable`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localmodel.api import LocalModel, LocalModelStatus
from localmodel.printable import printable
from localmodel.status import ConditionType, Reason, condition, with_health

IMAGE_PULL_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "ImageInspectError",
})
DEFAULT_CLASS_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                             "storageclass.beta.kubernetes.io/is-default-class")
MAX_WAITS = 8  # image waits kept of one pod
MESSAGE_LIMIT = 300  # characters kept of a kubelet's or scheduler's message
# Waiting reasons of a container being made, not failing (kubelet's
# ContainerCreating, PodInitializing); the image reasons are `_image_gap`'s.
_MAKING = frozenset({"ContainerCreating", "PodInitializing"})
FAILURE_LIMIT = 200  # characters kept of a failing container's own last message
READ = 2 * FAILURE_LIMIT  # characters read of any string of a container status (and kept)
MAX_FAILURES = 8  # failing containers kept of one pod
# A restart count is said as the bucket it reached, so a crash loop rewrites
# the status (and posts an Event) a few times in its life, not at each restart.
RESTART_BUCKETS = (1, 3, 10, 30, 100, 1000)
_CUT_NOTE = re.compile(r"\.\.\.\(\d+ chars in all\)$")  # printable's
# ANSI/ECMA-48 escape sequences: CSI (colours, cursor), OSC (a terminal's
# title), and the two- and three-character ones (ESC c resets a terminal).
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[ -/]*[0-~])")
SHOWN = 3  # replicas (or classes) named in one message; the rest counted


@dataclass(frozen=True)
class ImageWait:
    """A container the kubelet cannot start because it cannot pull its image."""

    container: str
    image: str
    reason: str
    message: str


@dataclass(frozen=True)
class ContainerFailure:
    """A container of a pod that keeps failing (`failing_containers`)."""

    container: str
    kind: str  # "container", "init container" or "sidecar" (a native one)
    reason: str  # CrashLoopBackOff, OOMKilled, Error, CreateContainerConfigError...
    restarts: int  # the bucket its restartCount reached (RESTART_BUCKETS), else 0
    last: str  # its last termination ("exit 2 (Error)") and message, bounded and cleaned


@dataclass(frozen=True)
class PodState:
    """What a gap reads of one of the model's pods."""

    replica: int
    name: str
    ready: bool
    waits: tuple[ImageWait, ...] = ()
    unschedulable: str | None = None  # the scheduler's message, if it left it Unschedulable
    failing: tuple[ContainerFailure, ...] = ()


@dataclass(frozen=True)
class ClaimState:
    """What a gap reads of one of the model's weights claims."""

    name: str
    storage_class: str | None  # spec.storageClassName (None: none)
    bound: bool


@dataclass(frozen=True)
class StorageClasses:
    """The cluster's StorageClass names, and which are marked default."""

    names: frozenset[str]
    defaults: tuple[str, ...]


@dataclass(frozen=True)
class Gap:
    """One thing missing before a model can run: a reason and its message."""

    reason: str
    message: str


def _section(obj: Any, name: str) -> Mapping[str, Any]:
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _statuses(status: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        value = status.get(key)
        # a list, or the tuple a watch keeps (controller/watch_shape.py)
        for s in value if isinstance(value, (list, tuple)) else []:
            if isinstance(s, Mapping):
                yield s


def image_waits(status: Mapping[str, Any]) -> tuple[ImageWait, ...]:
    """A pod status's containers waiting on an image the kubelet cannot pull."""
    out: list[ImageWait] = []
    for s in _statuses(status):
        waiting = _section(_section(s, "state"), "waiting")
        reason = waiting.get("reason")
        if reason in IMAGE_PULL_REASONS:
            out.append(ImageWait(printable(str(s.get("name") or ""), 63),
                                 printable(str(s.get("image") or ""), 256), str(reason),
                                 printable(str(waiting.get("message") or ""), MESSAGE_LIMIT)))
        if len(out) == MAX_WAITS:
            break
    return tuple(out)


def _sidecars(spec: Mapping[str, Any]) -> frozenset[str]:
    """The native sidecars: init containers with `restartPolicy: Always`."""
    inits = spec.get("initContainers")
    return frozenset(str(c.get("name")) for c in (inits if isinstance(inits, (list, tuple))
                                                  else ())
                     if isinstance(c, Mapping) and c.get("restartPolicy") == "Always")


def _one_line(message: Any, limit: int = FAILURE_LIMIT) -> str:
    """A container's own words (the tenant chooses its image: hostile) as one
    bounded line: ANSI escape sequences dropped, runs of whitespace and line
    breaks one space, any other control character shown as an escape, "..."
    where it was cut (no count: the watch keeps READ characters of it)."""
    raw = str(message or "")
    shown = printable(" ".join(_ANSI.sub("", raw[:READ]).split()), limit)
    cut = _CUT_NOTE.search(shown)
    if cut is not None:
        return shown[:cut.start()] + "..."
    return shown + ("..." if len(raw) > READ else "")


def _failed(terminated: Mapping[str, Any]) -> bool:
    code = terminated.get("exitCode")
    return bool(terminated) and (terminated.get("reason") == "OOMKilled"
                                 or (isinstance(code, int) and code != 0))


def _tail(message: Any) -> str:
    """The end of a container's termination message (the end of its log, with
    `FallbackToLogsOnError`: the error is last) as one line, cleaned as
    `_one_line` does, its last FAILURE_LIMIT characters, "..." where cut."""
    raw = str(message or "")
    text = " ".join(_ANSI.sub("", raw[-READ:]).split())
    shown = printable(text, 10 * READ)  # (escaped whole: READ characters at most)
    if len(shown) > FAILURE_LIMIT:
        return "..." + shown[-FAILURE_LIMIT:]
    return ("..." if len(raw) > READ else "") + shown


def _last_words(terminated: Mapping[str, Any]) -> str:
    """"exit 2 (Error): <the end of its message>"."""
    code, reason = terminated.get("exitCode"), terminated.get("reason")
    said = f"exit {code}" if isinstance(code, int) else "ended"
    said += f" ({_one_line(reason, 63)})" if reason else ""
    words = _tail(terminated.get("message"))
    return said + (f": {words}" if words else "")


def _bucket(count: Any) -> int:
    n = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return max((b for b in RESTART_BUCKETS if n >= b), default=0)


def _failure(s: Mapping[str, Any], kind: str) -> ContainerFailure | None:
    """One container status's failure, if it has one (module docstring)."""
    state, last_state = _section(s, "state"), _section(s, "lastState")
    waiting = _section(state, "waiting")
    waiting_reason = str(waiting.get("reason") or "")
    if waiting_reason in IMAGE_PULL_REASONS:
        return None  # (an image the kubelet cannot pull: `_image_gap`)
    now, before = _section(state, "terminated"), _section(last_state, "terminated")
    ended = now if _failed(now) else before if _failed(before) else None
    restarts = _bucket(s.get("restartCount"))
    if waiting_reason and waiting_reason not in _MAKING:
        reason = waiting_reason
    elif ended is not None and restarts:
        # Between two restarts of a crash loop (running, or being made again)
        # it is still one: the status does not flip at each restart.
        reason = "CrashLoopBackOff"
    elif ended is not None:
        reason = _one_line(ended.get("reason"), 63) or "Error"
    else:
        return None
    # its last termination, else the kubelet's own words (a
    # CreateContainerConfigError's missing Secret), FAILURE_LIMIT characters
    last = _last_words(ended) if ended is not None else _one_line(waiting.get("message"))
    return ContainerFailure(_one_line(s.get("name"), 63), kind, _one_line(reason, 63),
                            restarts, last)


def failing_containers(spec: Mapping[str, Any], status: Mapping[str, Any]
                       ) -> tuple[ContainerFailure, ...]:
    """A pod's containers that keep failing, init containers and native
    sidecars first (as the kubelet runs them), at most `MAX_FAILURES`."""
    sidecars = _sidecars(spec)
    out: list[ContainerFailure] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        value = status.get(key)
        for s in value if isinstance(value, (list, tuple)) else ():
            if not isinstance(s, Mapping):
                continue
            kind = ("container" if key == "containerStatuses"
                    else "sidecar" if s.get("name") in sidecars else "init container")
            failure = _failure(s, kind)
            if failure is not None and len(out) < MAX_FAILURES:
                out.append(failure)
    return tuple(out)


def _cut(value: Any, tail: bool = False) -> Any:
    """A string as much of it as `_one_line` (`_tail`: its end) ever reads,
    and one more character (they mark a cut longer than that); anything else
    as it is."""
    if not isinstance(value, str) or len(value) <= READ + 1:
        return value
    return value[-(READ + 1):] if tail else value[:READ + 1]


def _kept_status(s: Mapping[str, Any]) -> dict[str, Any]:
    state, last_state = _section(s, "state"), _section(s, "lastState")
    waiting, now = _section(state, "waiting"), _section(state, "terminated")
    before = _section(last_state, "terminated")

    def ended(t: Mapping[str, Any]) -> dict[str, Any]:
        return {k: _cut(t.get(k), tail=k == "message")
                for k in ("exitCode", "reason", "message") if k in t}

    kept: dict[str, Any] = {"name": _cut(s.get("name")), "image": _cut(s.get("image")),
                            "restartCount": s.get("restartCount"), "state": {}}
    if waiting:
        kept["state"]["waiting"] = {k: _cut(waiting.get(k)) for k in ("reason", "message")}
    if now:
        kept["state"]["terminated"] = ended(now)
    if before:
        kept["lastState"] = {"terminated": ended(before)}
    return kept


def kept_container_statuses(status: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What a watch keeps of a pod's container statuses: only those with an
    image wait or a failure, each cut to what `image_waits` and
    `failing_containers` read (which then read the same of it)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        value = status.get(key)
        kept = [_kept_status(s) for s in (value if isinstance(value, (list, tuple)) else ())
                if isinstance(s, Mapping) and (image_waits({key: [s]})
                                               or _failure(s, "container") is not None)]
        if kept:
            out[key] = kept[:MAX_WAITS + MAX_FAILURES]
    return out


def storage_classes(objects: Iterable[Mapping[str, Any]]) -> StorageClasses:
    names: set[str] = set()
    defaults: list[str] = []
    for obj in objects:
        meta = _section(obj, "metadata")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        names.add(name)
        annotations = _section(meta, "annotations")
        if any(annotations.get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS):
            defaults.append(name)
    return StorageClasses(frozenset(names), tuple(sorted(defaults)))


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:SHOWN]) or "none"
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _image_gap(pods: Sequence[PodState], namespace: str, pull_secrets: Sequence[str]
               ) -> Gap | None:
    waiting = [(p, p.waits[0]) for p in pods if p.waits and not p.ready]
    if not waiting:
        return None
    said = [f"replica {p.replica}: pod {p.name} cannot pull image {w.image} (container "
            f"{w.container}): {w.reason}" + (f": {w.message}" if w.message else "")
            for p, w in waiting[:SHOWN]]
    more = f"; and {len(waiting) - SHOWN} more" if len(waiting) > SHOWN else ""
    secrets = (f"the pull secrets ({', '.join(pull_secrets)}) must exist in namespace "
               f"{namespace}" if pull_secrets else "no pull secrets are set")
    return Gap(Reason.IMAGE_PULL_FAILED, "; ".join(said) + more + (
        ". Check the image: a model's own spec.engine.image, else the pinned image under the "
        "operator's --image-registry (the chart's global.imageRegistry); and the pull "
        f"secrets (--image-pull-secrets, global.imagePullSecrets): {secrets}"))


def _claim_gap(claims: Sequence[ClaimState], classes: StorageClasses) -> Gap | None:
    waiting = [c for c in claims if not c.bound]
    named = sorted({c.storage_class for c in waiting if c.storage_class} - classes.names)
    here = _listed(sorted(classes.names))
    if named:
        missing = [c.name for c in waiting if c.storage_class in named]
        return Gap(Reason.STORAGE_CLASS_NOT_FOUND,
                   f"claim {_listed(missing)} names StorageClass {', '.join(named)}, which "
                   f"does not exist (StorageClasses here: {here}): set "
                   "spec.storage.storageClassName to one that exists"
                   ", or create it")
    classless = [c.name for c in waiting if not c.storage_class]
    if classless and not classes.defaults:
        return Gap(Reason.NO_DEFAULT_STORAGE_CLASS,
                   f"claim {_listed(classless)} names no StorageClass and the cluster has no "
                   f"default one (StorageClasses here: {here}): set "
                   "spec.storage.storageClassName, or mark a class default (annotation "
                   "storageclass.kubernetes.io/is-default-class: \"true\"), or create a "
                   "PersistentVolume without a class for it")
    return None


def _scheduler_gap(pods: Sequence[PodState]) -> Gap | None:
    stuck = [p for p in pods if p.unschedulable is not None and not p.ready]
    if not stuck:
        return None
    said = [f"replica {p.replica}: the scheduler left pod {p.name} Unschedulable: "
            + (printable(p.unschedulable or "", MESSAGE_LIMIT) or "(no message)")
            for p in stuck[:SHOWN]]
    more = f"; and {len(stuck) - SHOWN} more" if len(stuck) > SHOWN else ""
    return Gap(Reason.UNSCHEDULABLE, "; ".join(said) + more)


def _restarts(n: int) -> str:
    return "" if not n else ", restarted once" if n == 1 else f", restarted {n}+ times"


def _failing_gap(pods: Sequence[PodState]) -> Gap | None:
    failing = [(p, p.failing[0]) for p in pods if p.failing and not p.ready]
    if not failing:
        return None
    said = [f"replica {p.replica}: pod {p.name}, {f.kind} {f.container}: {f.reason}"
            + _restarts(f.restarts) + (f", last {f.last}" if f.last else "")
            for p, f in failing[:SHOWN]]
    more = f"; and {len(failing) - SHOWN} more" if len(failing) > SHOWN else ""
    return Gap(Reason.CONTAINER_FAILING, "; ".join(said) + more)


def model_gap(
    namespace: str,
    pods: Sequence[PodState],
    claims: Sequence[ClaimState],
    classes: StorageClasses | None,
    pull_secrets: Sequence[str] = (),
) -> Gap | None:
    """The first gap of a model, in the order to fix them: an image that
    cannot be pulled, a container that keeps failing, a claim with no
    StorageClass to bind it (`classes` None: not known, not judged), a pod the
    scheduler left Unschedulable."""
    gap = _image_gap(pods, namespace, pull_secrets) or _failing_gap(pods)
    if gap is None and classes is not None:
        gap = _claim_gap(claims, classes)
    return gap or _scheduler_gap(pods)


def with_gap(status: LocalModelStatus, gap: Gap | None, lm: LocalModel, now: str
             ) -> LocalModelStatus:
    """A Ready=False status says the gap: its reason, and the replicas ready
    before its message (the kstatus pair follows it). Ready=True or Unknown,
    or no gap: the status as it is."""
    ready = next((c for c in status.conditions if c.type == ConditionType.READY.value), None)
    if gap is None or ready is None or ready.status.value != "False" or (
            ready.reason not in _REPLACED):
        return status
    message = _as_stored(f"{ready.message}; {gap.message}", gap.reason, lm.status)
    cond = condition(ConditionType.READY, False, gap.reason, message, lm, now)
    conditions = [cond if c is ready else c for c in status.conditions]
    return with_health(status.model_copy(update={"conditions": conditions}),
                       lm.metadata.generation, lm.status, now)


_REPLACED = (Reason.REPLICAS_NOT_READY.value,)  # (never an invalid spec's, a failure's)
# A failing container's own words after its termination ("..., last exit 2
# (Error): <words>"): their digits are masked when a message is compared with
# the stored one (`_as_stored`).
_OWN_WORDS = re.compile(r"(, last [^;:]*: )([^;]*)")


def _settled(message: str) -> str:
    return _OWN_WORDS.sub(lambda m: m.group(1) + re.sub(r"\d", "#", m.group(2)), message)


def _as_stored(message: str, reason: str, stored: LocalModelStatus | None) -> str:
    """The stored Ready message when it says the same failure but for the
    digits of a container's own words: a log's timestamps, counters and
    durations change at every restart (the kubelet keeps the end of the log,
    render/pods.py), which must not write the status or post an Event each time.
    Restart buckets, exit codes, reasons, containers and any other word still
    change it."""
    if reason != Reason.CONTAINER_FAILING or stored is None:
        return message
    was = next((c for c in stored.conditions if c.type == ConditionType.READY.value), None)
    if was is not None and was.reason == reason and _settled(was.message) == _settled(message):
        return was.message
    return message
