"""The cluster's own gaps, said up front (issue 31): a model whose image cannot
be pulled, whose weights claim has no StorageClass to bind it, or whose pod the
scheduler left Unschedulable is `Ready=False` with the reason and the setting
to change, in its status within a pass, not only on the pod. Pure: reduced
objects in, at most one `Gap` per model out; the operator (controller/policy.py)
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
- the scheduler's message on a pod's `PodScheduled=False/Unschedulable`.

Every string from the cluster is bounded and cleaned (`printable`).
"""

from __future__ import annotations

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
SHOWN = 3  # replicas (or classes) named in one message; the rest counted


@dataclass(frozen=True)
class ImageWait:
    """A container the kubelet cannot start because it cannot pull its image."""

    container: str
    image: str
    reason: str
    message: str


@dataclass(frozen=True)
class PodState:
    """What a gap reads of one of the model's pods."""

    replica: int
    name: str
    ready: bool
    waits: tuple[ImageWait, ...] = ()
    unschedulable: str | None = None  # the scheduler's message, if it left it Unschedulable


@dataclass(frozen=True)
class ClaimState:
    """What a gap reads of one of the model's weights claims."""

    name: str
    storage_class: str | None  # spec.storageClassName (None: none)
    bound: bool


@dataclass(frozen=True)
class StorageClasses:
    names: frozenset[str]
    defaults: tuple[str, ...]


@dataclass(frozen=True)
class Gap:
    reason: str
    message: str


def _section(obj: Any, name: str) -> Mapping[str, Any]:
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _statuses(status: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        value = status.get(key)
        # a list, or the tuple a watch keeps (controller/kept.py)
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


def kept_image_waits(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a watch keeps of a pod's container statuses: only the image waits,
    in the shape `image_waits` reads."""
    return [{"name": w.container, "image": w.image,
             "state": {"waiting": {"reason": w.reason, "message": w.message}}}
            for w in image_waits(status)]


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


def model_gap(
    namespace: str,
    pods: Sequence[PodState],
    claims: Sequence[ClaimState],
    classes: StorageClasses | None,
    pull_secrets: Sequence[str] = (),
) -> Gap | None:
    """The first gap of a model, in the order to fix them: an image that
    cannot be pulled, a claim with no StorageClass to bind it (`classes` None:
    not known, not judged), a pod the scheduler left Unschedulable."""
    gap = _image_gap(pods, namespace, pull_secrets)
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
    cond = condition(ConditionType.READY, False, gap.reason,
                     f"{ready.message}; {gap.message}", lm, now)
    conditions = [cond if c is ready else c for c in status.conditions]
    return with_health(status.model_copy(update={"conditions": conditions}),
                       lm.metadata.generation, lm.status, now)


_REPLACED = (Reason.REPLICAS_NOT_READY.value,)  # (never an invalid spec's, a failure's)
