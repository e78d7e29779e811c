"""A doorman as the operator's pass sees it (controller/snapshot.py, objects.py):
its pod, rendered (render/doorman.py), scheduled and Ready and kept by the
pods' watch as every pod is, counts as node usage (so the planner never
over-commits its node) and never as one of its model's replicas."""

from __future__ import annotations

import pytest

from localmodel.controller.observed import current_placements
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.watched import pod as kept_pod
from localmodel.planner import Usage
from localmodel.render import RenderOptions
from localmodel.render.doorman import doorman_objects
from tests.builders import MakeNode
from tests.controller.test_changes import QWEN

pytestmark = pytest.mark.unit

SLEEPER = QWEN.spec(idle={"after": "30m"})


def _scheduled_doorman(node: str) -> dict[str, object]:
    [pod] = doorman_objects(SLEEPER.obj(), RenderOptions())
    return {**pod, "spec": {**pod["spec"], "nodeName": node},
            "status": {"podIP": "10.0.0.9", "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_doorman_is_node_usage_and_never_a_replica() -> None:
    snap = Snapshot(localmodels=[SLEEPER.manifest()],
                    nodes=[MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest()],
                    pods=[kept_pod(_scheduled_doorman("n0"))])
    obs = observe(snap)
    assert obs.usage == {"n0": Usage(cpu_milli=50, memory_bytes=64 * 1024**2)}
    assert obs.pods == {}
    key = SLEEPER.obj().key
    assert obs.pods_of(key) == []
    assert current_placements(obs)[key] == [None]  # its replica is where it was: nowhere


def test_the_pass_keeps_each_models_doorman_by_its_role_label() -> None:
    """`Observed.doormen_of`: the model's doorman pods (its name label, the
    role label, a controller owner), Ready or not; a pod with the role label
    but no owner, or a replica label, is no doorman."""
    pod = _scheduled_doorman("n0")
    key = SLEEPER.obj().key
    unowned = {**pod, "metadata": {**pod["metadata"], "name": "stray",  # type: ignore[dict-item]
                                   "ownerReferences": []}}
    labels = {**pod["metadata"]["labels"], "localmodel.dev/replica": "0"}  # type: ignore[index]
    replica_like = {**pod, "metadata": {**pod["metadata"], "name": "odd",  # type: ignore[dict-item]
                                        "labels": labels}}
    snap = Snapshot(localmodels=[SLEEPER.manifest()],
                    nodes=[MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest()],
                    pods=[kept_pod(p) for p in (pod, unowned, replica_like)])
    obs = observe(snap)
    [doorman] = obs.doormen_of(key)
    assert (doorman.name, doorman.node, doorman.ready, doorman.terminating) == (
        "qwen3-doorman", "n0", True, False)
    assert doorman.owner_uid == SLEEPER.obj().metadata.uid
    assert obs.doormen_of("ai/other") == []
