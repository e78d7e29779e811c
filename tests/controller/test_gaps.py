"""The cluster's own gaps (localmodel/gaps.py, issue 31) as tables: which gap a
model's pods, claims and the StorageClasses give, in the order to fix them;
what the watches keep of a pod's container statuses; the default class's
annotation; hostile kubelet and scheduler messages bounded and cleaned; and the
status a gap gives (Ready=False with its reason, the kstatus pair following)."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.contract import LABEL_MANAGED_BY, LABEL_NAME, LABEL_REPLICA, MANAGED_BY
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.watched import pod as kept_pod
from localmodel.doctor.cluster import ClusterView, cluster_findings
from localmodel.doctor.report import Verdict
from localmodel.gaps import (
    ClaimState,
    Gap,
    ImageWait,
    PodState,
    StorageClasses,
    image_waits,
    model_gap,
    storage_classes,
    with_gap,
)
from localmodel.render import RenderOptions
from localmodel.status import ConditionType, Reason
from tests.controller.test_changes import NODE, NOW, QWEN

pytestmark = pytest.mark.unit

IMAGE = "registry.corp:5000/ollama/ollama:0.0.1"
PULL = ImageWait("ollama", IMAGE, "ErrImagePull",
                 'failed to pull and unpack image "registry.corp:5000/ollama/ollama:0.0.1": '
                 "401 Unauthorized")
BACKOFF = ImageWait("init", "bad//name", "InvalidImageName", 'couldn\'t parse image name')
LOCAL = StorageClasses(frozenset({"local-disk", "fast"}), ("local-disk",))
NO_DEFAULT = StorageClasses(frozenset({"fast"}), ())
SCHED = "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."


def pod(replica: int = 0, ready: bool = False, waits: tuple[ImageWait, ...] = (),
        unschedulable: str | None = None) -> PodState:
    return PodState(replica, f"chat-{replica}", ready, waits, unschedulable)


def claim(cls: str | None, bound: bool = False, name: str = "weights-chat-0") -> ClaimState:
    return ClaimState(name, cls, bound)


CASES: list[tuple[str, list[PodState], list[ClaimState], StorageClasses | None, str | None,
                  tuple[str, ...]]] = [
    # (id, pods, claims, classes, reason, words the message holds)
    ("all fine", [pod(ready=True)], [claim("local-disk", True)], LOCAL, None, ()),
    ("starting, nothing wrong", [pod()], [claim("local-disk")], LOCAL, None, ()),
    ("image cannot be pulled", [pod(waits=(PULL,))], [claim("local-disk", True)], LOCAL,
     Reason.IMAGE_PULL_FAILED,
     (IMAGE, "ErrImagePull", "401 Unauthorized", "container ollama", "replica 0",
      "--image-registry", "global.imagePullSecrets", "regcred", "namespace team-a")),
    ("invalid image name", [pod(waits=(BACKOFF,))], [], LOCAL, Reason.IMAGE_PULL_FAILED,
     ("bad//name", "InvalidImageName")),
    ("a ready pod's old wait is not a gap", [pod(ready=True, waits=(PULL,))], [], LOCAL,
     None, ()),
    ("the image first, then the claim", [pod(waits=(PULL,))], [claim("gone")], LOCAL,
     Reason.IMAGE_PULL_FAILED, (IMAGE,)),
    ("a named class that does not exist", [pod(unschedulable=SCHED)], [claim("gone")], LOCAL,
     Reason.STORAGE_CLASS_NOT_FOUND,
     ("StorageClass gone", "does not exist", "fast, local-disk",
      "spec.storage.storageClassName")),
    ("no class and no default", [pod(unschedulable=SCHED)], [claim(None)], NO_DEFAULT,
     Reason.NO_DEFAULT_STORAGE_CLASS,
     ("names no StorageClass", "no default", "StorageClasses here: fast",
      "spec.storage.storageClassName", "is-default-class")),
    ("no class and no classes at all", [pod()], [claim(None)],
     StorageClasses(frozenset(), ()), Reason.NO_DEFAULT_STORAGE_CLASS,
     ("StorageClasses here: none",)),
    ("no class, but bound to a volume", [pod()], [claim(None, True)], NO_DEFAULT, None, ()),
    ("a missing class of a bound claim", [pod()], [claim("gone", True)], LOCAL, None, ()),
    ("classes not known: not judged", [pod()], [claim("gone")], None, None, ()),
    ("the scheduler's own reason", [pod(unschedulable="0/1 nodes are available: 1 node(s) "
                                          "didn't find available persistent volumes to bind.")],
     [claim("local-disk")], LOCAL, Reason.UNSCHEDULABLE,
     ("replica 0", "chat-0", "didn't find available persistent volumes to bind")),
    ("unschedulable without a message", [pod(unschedulable="")], [], LOCAL,
     Reason.UNSCHEDULABLE, ("(no message)",)),
    ("many replicas: three named, the rest counted",
     [pod(r, waits=(PULL,)) for r in range(5)], [], LOCAL, Reason.IMAGE_PULL_FAILED,
     ("replica 2", "and 2 more")),
]


@pytest.mark.parametrize(("pods", "claims", "classes", "reason", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_gap(pods: list[PodState], claims: list[ClaimState],
                 classes: StorageClasses | None, reason: str | None,
                 words: tuple[str, ...]) -> None:
    gap = model_gap("team-a", pods, claims, classes, ("regcred",))
    assert (gap.reason if gap else None) == reason
    for word in words:
        assert gap is not None and word in gap.message, word
    if gap is not None:
        assert "replica 3" not in gap.message  # at most three named


def test_without_pull_secrets_it_says_none_are_set() -> None:
    gap = model_gap("ns", [pod(waits=(PULL,))], [], LOCAL)
    assert gap is not None and "no pull secrets are set" in gap.message


# ---- reading objects -----------------------------------------------------------


def _waiting(name: str, image: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "image": image, "state": {"waiting": {"reason": reason,
                                                                  "message": message}}}


def test_image_waits_read_what_the_kubelet_writes() -> None:
    """The statuses as the kubelet writes them: init containers first, only the
    image reasons, hostile text cleaned and cut."""
    status = {
        "initContainerStatuses": [_waiting("init", IMAGE, "ImagePullBackOff",
                                           "Back-off pulling image \x1b[2J" + "x" * 5000)],
        "containerStatuses": [
            _waiting("ollama", IMAGE, "PodInitializing"),
            _waiting("gateway", "g:1", "CrashLoopBackOff"),
            {"name": "x", "state": {"running": {}}},
            "not a mapping",
        ],
    }
    [wait] = image_waits(status)
    assert (wait.container, wait.image, wait.reason) == ("init", IMAGE, "ImagePullBackOff")
    assert "\x1b" not in wait.message and "\\x1b" in wait.message
    assert len(wait.message) < 400
    assert image_waits({"containerStatuses": "nonsense"}) == ()
    assert len(image_waits({"containerStatuses": [_waiting(f"c{i}", "i", "ErrImagePull")
                                                  for i in range(50)]})) == 8


def test_the_watch_keeps_only_the_image_waits() -> None:
    ours = {"name": "p", "labels": {LABEL_MANAGED_BY: MANAGED_BY}}
    body = {"metadata": ours, "spec": {}, "status": {
        "phase": "Pending",
        "containerStatuses": [_waiting("ollama", IMAGE, "ErrImagePull", "denied"),
                              {"name": "gateway", "state": {"running": {}}, "imageID": "x"}]}}
    kept = kept_pod(body)["status"]
    assert image_waits(kept) == image_waits(body["status"])
    assert len(kept["containerStatuses"]) == 1
    assert "containerStatuses" not in kept_pod({"metadata": ours,
                                                "status": {"phase": "Running"}})["status"]


@pytest.mark.parametrize(("annotations", "default"), [
    ({"storageclass.kubernetes.io/is-default-class": "true"}, True),
    ({"storageclass.beta.kubernetes.io/is-default-class": "true"}, True),
    ({"storageclass.kubernetes.io/is-default-class": "false"}, False),
    ({"storageclass.kubernetes.io/is-default-class": "True"}, False),  # as the API server reads it
    ({}, False),
])
def test_the_default_class(annotations: dict[str, str], default: bool) -> None:
    classes = storage_classes([{"metadata": {"name": "a", "annotations": annotations}},
                               {"metadata": {}}, {"nonsense": 1}])
    assert classes.names == frozenset({"a"})
    assert classes.defaults == (("a",) if default else ())


# ---- the status ----------------------------------------------------------------


def _pass(pods: list[dict[str, Any]], claims: list[dict[str, Any]],
          classes: list[dict[str, Any]]) -> Any:
    lm = QWEN.obj()
    snap = Snapshot(localmodels=[QWEN.manifest()], nodes=[NODE.manifest()], pods=pods,
                    claims=claims, storageclasses=classes)
    plan = plan_pass(observe(snap), NOW, RenderOptions(image_pull_secrets=("regcred",)),
                     placed={}, avoid={})
    [work] = [w for w in plan.work if w.model.key == lm.key]
    return {c.type: c for c in work.status.conditions}


def test_a_pass_with_no_default_class_says_so() -> None:
    """A model whose claims name no class, on a cluster with no default one:
    Ready=False NoDefaultStorageClass in the status the pass writes; with a
    default class, the plain ReplicasNotReady."""
    conditions = _pass([], [_claim(None)], [])
    ready = conditions[ConditionType.READY.value]
    assert (ready.status.value, ready.reason) == ("False", Reason.NO_DEFAULT_STORAGE_CLASS)
    assert ready.message.startswith("0/")
    # (kstatus: Reconciling, while the pods are being made; never Stalled)
    assert ConditionType.STALLED.value not in conditions
    fine = _pass([], [_claim(None)], [{"metadata": {"name": "d", "annotations": {
        "storageclass.kubernetes.io/is-default-class": "true"}}}])
    assert fine[ConditionType.READY.value].reason == Reason.REPLICAS_NOT_READY


def _claim(cls: str | None) -> dict[str, Any]:
    lm = QWEN.obj()
    return {"metadata": {"name": f"weights-{lm.metadata.name}-0",
                         "namespace": lm.metadata.namespace,
                         "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_NAME: lm.metadata.name,
                                    LABEL_REPLICA: "0"}},
            "spec": {**({"storageClassName": cls} if cls else {})}}


def test_with_gap_changes_only_a_not_ready_status() -> None:
    lm = QWEN.obj()
    gap = Gap(Reason.IMAGE_PULL_FAILED, "replica 0: cannot pull")
    plan = plan_pass(observe(Snapshot(localmodels=[QWEN.manifest()], nodes=[NODE.manifest()])), NOW,
                     RenderOptions(), placed={}, avoid={})
    status = plan.work[0].status
    changed = with_gap(status, gap, lm, NOW)
    ready = {c.type: c for c in changed.conditions}[ConditionType.READY.value]
    assert ready.reason == Reason.IMAGE_PULL_FAILED and "cannot pull" in ready.message
    assert with_gap(status, None, lm, NOW) is status
    offline = status.model_copy(update={"conditions": [
        c.model_copy(update={"reason": Reason.INVALID_SPEC}) if c.type == "Ready" else c
        for c in status.conditions]})
    assert with_gap(offline, gap, lm, NOW) is offline  # an invalid spec's Ready is its own


# ---- doctor says the same ------------------------------------------------------


def _lm(name: str, ready: dict[str, str] | None = None) -> dict[str, Any]:
    status = {"conditions": [{"type": "Ready", **ready}]} if ready else {}
    return {"metadata": {"name": name, "namespace": "team-a"}, "status": status}


def _raw_pod(model: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": f"{model}-0", "namespace": "team-a",
                         "labels": {LABEL_NAME: model, LABEL_REPLICA: "0"}},
            "spec": {"containers": []}, "status": status}


def test_doctor_says_the_gaps() -> None:
    """From the pods it reads (with no operator running), else from the status."""
    pulled = _raw_pod("pull", {"containerStatuses": [_waiting("ollama", IMAGE, "ErrImagePull",
                                                              "401 Unauthorized")]})
    stuck = _raw_pod("stuck", {"conditions": [{"type": "PodScheduled", "status": "False",
                                               "reason": "Unschedulable", "message": SCHED}]})
    fine = _raw_pod("fine", {"conditions": [{"type": "Ready", "status": "True"}]})
    models = [_lm("pull"), _lm("stuck"), _lm("fine"),
              _lm("cls", {"status": "False", "reason": "StorageClassNotFound",
                          "message": "claim w names StorageClass fast-ssd"}),
              _lm("plain", {"status": "False", "reason": "ReplicasNotReady", "message": "0/1"})]
    _, findings = cluster_findings(ClusterView(nodes=[], pods=[pulled, stuck, fine],
                                               models=models))
    said = {f.message.split(":")[0]: f for f in findings if f.check == "gaps"}
    assert set(said) == {"LocalModel team-a/pull", "LocalModel team-a/stuck",
                         "LocalModel team-a/cls"}
    assert IMAGE in said["LocalModel team-a/pull"].message
    assert "401 Unauthorized" in said["LocalModel team-a/pull"].message
    assert "unbound immediate" in said["LocalModel team-a/stuck"].message
    assert "fast-ssd" in said["LocalModel team-a/cls"].message
    assert all(f.verdict == Verdict.FAIL for f in said.values())
    scoped = cluster_findings(ClusterView(nodes=[], pods=[pulled], models=[_lm("pull")],
                                          namespace="elsewhere"))[1]
    assert not [f for f in scoped if f.check == "gaps"]
