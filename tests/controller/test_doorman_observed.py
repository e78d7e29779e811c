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
