"""A replica whose container keeps failing says so (issue 42): which replica,
which container (init containers and native sidecars too), its reason, its
restarts (a bucket) and its last message, bounded and cleaned, in the model's
Ready condition, its Events and doctor's gaps (localmodel/gaps.py), read at
the edge from the pods the watch keeps, without a status write per restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from localmodel import engines
from localmodel.contract import CONTAINER_GATEWAY
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.watch_shape import plain
from localmodel.controller.watched import pod as kept_pod
from localmodel.doctor.cluster import ClusterView, cluster_findings
from localmodel.doctor.report import Verdict
from localmodel.events import EventReason, status_events
from localmodel.gaps import (
    FAILURE_LIMIT,
    ContainerFailure,
    failing_containers,
    image_waits,
    kept_container_statuses,
)
from localmodel.render import RenderOptions
from localmodel.status import ConditionType, Reason, status_body
from tests.builders import (
    GEMMA_SHA256,
    GEMMA_URL,
    MakeNode,
    container_status,
    with_container_statuses,
)
from tests.controller.test_changes import NOW, QWEN, converged
from tests.controller.test_reconcile_quiet import Store, reconciler, settled
from tests.controller.test_reconcile_quiet import model as quiet_model

pytestmark = pytest.mark.unit

DENIED = "Permission denied: '/etc/localmodel/keys/keys.json'"
CRASHED = (2, "Error", DENIED)
NO_SECRET = 'secret "keys" not found'
SIDECAR_SPEC = {"initContainers": [{"name": "relay", "restartPolicy": "Always"},
                                   {"name": "fetch"}]}

# (id, spec, init statuses, container statuses, what failing_containers says)
FAILING: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]],
                    list[ContainerFailure]]] = [
    ("running, never failed", {}, [], [container_status("gateway")], []),
    ("being made", {}, [container_status("fetch", waiting=("PodInitializing", ""))],
     [container_status("gateway", waiting=("ContainerCreating", ""))], []),
    ("crash loop, backing off", {}, [], [container_status(
        "gateway", waiting=("CrashLoopBackOff", "back-off 40s restarting failed container"),
        last=CRASHED, restarts=7)],
     [ContainerFailure("gateway", "container", "CrashLoopBackOff", 3,
                       f"exit 2 (Error): {DENIED}")]),
    ("crash loop, running again between two restarts: the same", {}, [], [container_status(
        "gateway", last=CRASHED, restarts=8)],
     [ContainerFailure("gateway", "container", "CrashLoopBackOff", 3,
                       f"exit 2 (Error): {DENIED}")]),
    ("the first failure, not restarted yet", {}, [], [container_status(
        "ollama", terminated=(1, "Error", "boom"))],
     [ContainerFailure("ollama", "container", "Error", 0, "exit 1 (Error): boom")]),
    ("killed for memory", {}, [], [container_status(
        "ollama", waiting=("CrashLoopBackOff", ""), last=(137, "OOMKilled", ""), restarts=1)],
     [ContainerFailure("ollama", "container", "CrashLoopBackOff", 1, "exit 137 (OOMKilled)")]),
    ("a Secret that does not exist", {}, [], [container_status(
        "gateway", waiting=("CreateContainerConfigError", NO_SECRET))],
     [ContainerFailure("gateway", "container", "CreateContainerConfigError", 0, NO_SECRET)]),
    ("an image that cannot be pulled is the image gap's", {}, [], [container_status(
        "ollama", waiting=("ImagePullBackOff", "Back-off pulling image"))], []),
    ("an init container that completed", {},
     [container_status("fetch", terminated=(0, "Completed", ""))],
     [container_status("gateway")], []),
    ("a failing init container", SIDECAR_SPEC, [container_status(
        "fetch", waiting=("CrashLoopBackOff", ""), last=(3, "Error", "sha256 mismatch"),
        restarts=40)], [],
     [ContainerFailure("fetch", "init container", "CrashLoopBackOff", 30,
                       "exit 3 (Error): sha256 mismatch")]),
    ("a failing native sidecar", SIDECAR_SPEC, [container_status(
        "relay", last=(2, "Error", ""), restarts=2)], [],
     [ContainerFailure("relay", "sidecar", "CrashLoopBackOff", 1, "exit 2 (Error)")]),
]


@pytest.mark.parametrize(("spec", "inits", "containers", "said"),
                         [c[1:] for c in FAILING], ids=[c[0] for c in FAILING])
def test_what_a_failing_container_says(spec: dict[str, Any], inits: list[dict[str, Any]],
                                       containers: list[dict[str, Any]],
                                       said: list[ContainerFailure]) -> None:
    status = {"initContainerStatuses": inits, "containerStatuses": containers}
    assert list(failing_containers(spec, status)) == said


HOSTILE = [
    ("huge", "x" * 1_000_000),
    ("huge, its end said", "early line\n" * 100_000 + "fatal: the end"),
    ("escapes past the bound", "\x1b[0m" * 1000 + "tail"),
    ("ANSI escapes", "\x1b[2J\x1b[31mred\x1b[0m \x1b]0;title\x07 \x1bc\x1b(B" * 5),
    ("lines", "Traceback (most recent call last):\n  File \"x\"\r\nError: no\n\n"),
    ("binary", "\x00\x01\x7f\x9b\ud800\ufffe\u202e\u2028end"),
]


@pytest.mark.parametrize("message", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_containers_own_message_is_one_bounded_clean_line(message: str) -> None:
    """The container is the tenant's: what it says reaches status, Events and
    terminals cut to FAILURE_LIMIT characters, as one line, nothing in it acting
    on a terminal (ANSI sequences dropped, other controls shown as escapes)."""
    status = {"containerStatuses": [container_status(
        message[:300], waiting=("CrashLoopBackOff", message), last=(1, message, message),
        restarts=3)]}
    [f] = failing_containers({}, status)
    assert failing_containers({}, kept_container_statuses(status)) == (f,)  # the watch's form
    for text in (f.container, f.reason, f.last):
        assert all(ch.isprintable() for ch in text), text
        assert "\x1b" not in text and "\n" not in text and "\r" not in text
    assert len(f.last) <= len("exit 1 ()") + 63 + len(": ...") * 2 + FAILURE_LIMIT
    assert "chars in all" not in f.last  # (no count: the watch keeps only the start)
    assert len(f.container) <= 63 + 30 and len(f.reason) <= 63 + 30
    if "red" in message:
        assert "red" in f.last and "[31m" not in f.last and "title" not in f.last
    if message.endswith("fatal: the end"):  # the end of a log is where its error is
        assert f.last.endswith("early line fatal: the end") and f.last.startswith("exit 1 (")
    if "Traceback" in message:
        assert "Traceback (most recent call last): File \"x\" Error: no" in f.last


def test_statuses_not_shaped_as_the_kubelet_writes_are_no_failure() -> None:
    weird: list[Any] = [
        "not a mapping", None, {"name": "a", "state": "running"},
        {"name": "b", "state": {"terminated": {"exitCode": "2"}}, "restartCount": "9"},
        {"name": ["c"], "restartCount": True, "lastState": {"terminated": {"exitCode": 2}},
         "state": {"waiting": {"reason": None}}},
    ]
    said = failing_containers({"initContainers": "nonsense"},
                              {"containerStatuses": weird, "initContainerStatuses": 7})
    assert [(f.container, f.reason, f.restarts, f.last) for f in said] == [
        ("['c']", "Error", 0, "exit 2")]
    many = [container_status(f"c{i}", terminated=(1, "Error", "")) for i in range(50)]
    assert len(failing_containers({}, {"containerStatuses": many})) == 8


# ---- the model's status and Events --------------------------------------------


def _crashing(restarts: int, message: str = DENIED, container: str = CONTAINER_GATEWAY
              ) -> Snapshot:
    """The model's one replica, its pod stored, one container crash-looping."""
    snap, _ = converged(1)
    pods = [with_container_statuses(p, [container_status(
        container, waiting=("CrashLoopBackOff", f"back-off {restarts}0s restarting"),
        last=(2, "Error", message), restarts=restarts)]) for p in snap.pods]
    return Snapshot(**{**snap.__dict__, "pods": pods})


def _status(snap: Snapshot, kept: bool = False) -> Any:
    if kept:  # as the watch keeps the pods
        snap = Snapshot(**{**snap.__dict__, "pods": [kept_pod(p) for p in snap.pods]})
    plan = plan_pass(observe(snap), NOW, RenderOptions(), placed={}, avoid={})
    [work] = [w for w in plan.work if w.model.key == QWEN.obj().key]
    return work.status


def test_a_crash_looping_container_is_in_the_ready_condition() -> None:
    """The real node's case: a gateway exiting 2 on its keys file is named in
    Ready=False ContainerFailing, with its restarts and last message, also from
    the pods as the watch keeps them; kstatus reads it as in progress."""
    status = _status(_crashing(7))
    conditions = {c.type: c for c in status.conditions}
    ready = conditions[ConditionType.READY.value]
    assert (ready.status.value, ready.reason) == ("False", Reason.CONTAINER_FAILING)
    for word in ("replica 0", "qwen3-0", f"container {CONTAINER_GATEWAY}", "CrashLoopBackOff",
                 "restarted 3+ times", "exit 2 (Error)", DENIED):
        assert word in ready.message, word
    # kstatus and Argo CD say it too (in progress, not failed: it may recover)
    reconciling = conditions[ConditionType.RECONCILING.value]
    assert (reconciling.reason, reconciling.message) == (ready.reason, ready.message)
    assert ConditionType.STALLED.value not in conditions
    assert status_body(_status(_crashing(7), kept=True)) == status_body(status)


def test_a_climbing_restart_count_writes_the_status_once_per_bucket() -> None:
    """Restarts 3 to 9 (and the kubelet's back-off message, which changes at
    each restart) say the same status: no write, no Event per restart; 10 does."""
    bodies = {n: status_body(_status(_crashing(n))) for n in (3, 5, 9, 10)}
    assert bodies[3] == bodies[5] == bodies[9] != bodies[10]


def test_the_failure_is_one_event_per_thing_said() -> None:
    before = _status(converged(1)[0])
    failing = _status(_crashing(4))
    [event] = status_events(before, failing)
    assert event.reason == EventReason.CONTAINER_FAILING and event.warning
    assert DENIED in event.message and "replica 0" in event.message
    assert status_events(failing, _status(_crashing(6))) == []  # the same thing said
    [again] = status_events(failing, _status(_crashing(4, "No space left on device")))
    assert "No space left on device" in again.message
    assert [e for e in status_events(failing, before)
            if e.reason == EventReason.CONTAINER_FAILING] == []


def test_an_image_pull_is_said_as_an_image_not_as_a_failing_container() -> None:
    snap, _ = converged(1)
    pods = [with_container_statuses(p, [container_status(
        "ollama", waiting=("ImagePullBackOff", "401"), restarts=0),
        container_status(CONTAINER_GATEWAY, last=CRASHED, restarts=1)]) for p in snap.pods]
    status = _status(Snapshot(**{**snap.__dict__, "pods": pods}))
    ready = {c.type: c for c in status.conditions}[ConditionType.READY.value]
    assert ready.reason == Reason.IMAGE_PULL_FAILED
    assert image_waits(pods[0]["status"])


def test_doctor_says_a_failing_container() -> None:
    """From the pods doctor reads (no operator running), else the stored status."""
    snap = _crashing(12)
    model = {"metadata": {"name": "qwen3", "namespace": QWEN.obj().metadata.namespace}}
    _, findings = cluster_findings(ClusterView(nodes=[], pods=list(snap.pods), models=[model]))
    [gap] = [f for f in findings if f.check == "gaps"]
    assert gap.verdict == Verdict.FAIL
    for word in ("ContainerFailing", f"container {CONTAINER_GATEWAY}", "restarted 10+ times",
                 DENIED):
        assert word in gap.message, word
    stored = {**model, "status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "ContainerFailing",
        "message": "replica 0: pod qwen3-0, container gateway: CrashLoopBackOff"}]}}
    [said] = [f for f in cluster_findings(ClusterView(nodes=[], pods=[], models=[stored]))[1]
              if f.check == "gaps"]
    assert "CrashLoopBackOff" in said.message


@pytest.mark.parametrize("engine", engines.NAMES)
def test_every_container_keeps_the_end_of_its_log_when_it_fails(engine: str) -> None:
    """What the status says of a failing container is what the kubelet kept:
    with nothing written to the termination message, the end of its log."""
    gguf = {"url": GEMMA_URL, "sha256": GEMMA_SHA256}
    snap, _ = converged(1, engine={"name": engine}, gguf=gguf)
    [pod] = snap.pods
    spec = pod["spec"]
    every = [*spec.get("initContainers", []), *spec["containers"]]
    assert len(every) >= 2 and CONTAINER_GATEWAY in {c["name"] for c in every}
    assert {c.get("terminationMessagePolicy") for c in every} == {"FallbackToLogsOnError"}


def test_the_reconciler_writes_a_crash_loop_once_per_restart_bucket() -> None:
    """Through the reconciler and the watches (test_reconcile_quiet's stand-in
    API server): a settled model whose gateway starts crash-looping gets one
    status write and one ContainerFailing Event; each restart after that (a
    pod watch event, the kubelet's back-off message changing) writes nothing
    until the count reaches the next bucket; a recovery is written once."""
    store = Store()
    store.put("nodes", MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest())
    store.put("localmodels", quiet_model("a"))
    rec = reconciler(store)
    settled(store, rec)
    [kept] = store.stores["pods"].values()
    healthy = plain(kept)

    def restarts(n: int) -> list[tuple[str, str]]:
        made = len(store.writes)
        store.put("pods", {**with_container_statuses(healthy, [container_status(
            CONTAINER_GATEWAY, waiting=("CrashLoopBackOff", f"back-off {n}0s restarting"),
            last=CRASHED, restarts=n)]), "kind": "Pod"})
        asyncio.run(rec.reconcile_once())
        return store.writes[made:]

    assert restarts(3) == [("create", "Event"), ("apply", "LocalModel/status")]
    assert "ContainerFailing" in str(store.model("a")["status"]["conditions"])
    for n in range(4, 10):
        assert restarts(n) == [], n
    assert restarts(10) == [("create", "Event"), ("apply", "LocalModel/status")]
    made = len(store.writes)
    store.put("pods", {**healthy, "kind": "Pod"})
    asyncio.run(rec.reconcile_once())
    assert ("apply", "LocalModel/status") in store.writes[made:]
    assert "ContainerFailing" not in str(store.model("a")["status"]["conditions"])


def test_a_log_whose_numbers_change_at_each_restart_writes_nothing_new() -> None:
    """With the end of its log as its message, a crash-looping engine says
    other timestamps at each restart: the stored message stays (no write, no
    Event); other words, another exit code or the next restart bucket are
    written."""
    def ollama(at: str, said: str = "error loading model") -> str:
        return f"time=2026-12-06T17:{at}.123Z level=ERROR source=server.go:61 msg=\"{said}\""

    def status_after(stored: Any, restarts: int, message: str, code: int = 2) -> Any:
        snap, _ = converged(1)
        pods = [with_container_statuses(p, [container_status(
            "ollama", waiting=("CrashLoopBackOff", ""), last=(code, "Error", message),
            restarts=restarts)]) for p in snap.pods]
        model = QWEN.manifest() if stored is None else {**QWEN.manifest(),
                                                       "status": status_body(stored)}
        snap = Snapshot(**{**snap.__dict__, "localmodels": [model], "pods": pods})
        return _status(snap)

    first = status_after(None, 3, ollama("00:01"))
    ready = {c.type: c for c in first.conditions}[ConditionType.READY.value]
    assert "17:00:01.123Z" in ready.message and "error loading model" in ready.message
    assert status_body(status_after(first, 4, ollama("05:09"))) == status_body(first)
    for changed in (status_after(first, 4, ollama("05:09", "out of memory")),
                    status_after(first, 4, ollama("00:01"), code=1),
                    status_after(first, 10, ollama("00:01"))):
        assert status_body(changed) != status_body(first)
        assert len(status_events(first, changed)) == 1
