"""A pass's speed work (controller/plan.py `plan_pass`): which replicas the
operator may read (Ready pods with an IP, gateway on), their peer keys from
the node facts, and the published numbers reaching status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localmodel.contract import CONTAINER_GATEWAY
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.speed import cpu_model
from localmodel.render import RenderOptions
from localmodel.speed import Expected, Published, Rates, SpeedPolicy
from localmodel.status import ConditionType
from tests.controller.test_changes import NODE, NOW, converged

pytestmark = pytest.mark.unit

CPU_LABELS = {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
              "feature.node.kubernetes.io/cpu-model.family": "6",
              "feature.node.kubernetes.io/cpu-model.id": "143"}


def with_ips(snap: Snapshot, ready: dict[int, bool] | None = None) -> Snapshot:
    pods = []
    for p in snap.pods:
        p = copy.deepcopy(p)
        replica = int(p["metadata"]["labels"]["localmodel.dev/replica"])
        p["status"]["podIP"] = f"10.85.0.{10 + replica}"
        if ready is not None and not ready.get(replica, True):
            p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        pods.append(p)
    nodes = [NODE.named(n["metadata"]["name"]).labels(CPU_LABELS).manifest() for n in snap.nodes]
    return Snapshot(**{**snap.__dict__, "pods": pods, "nodes": nodes})


def plan_of(snap: Snapshot, speeds: dict[str, dict[int, Published]] | None = None) -> Any:
    return plan_pass(observe(snap), NOW, RenderOptions(), placed={}, avoid={},
                     speeds=speeds, speed_policy=SpeedPolicy())


def test_ready_pods_with_an_ip_are_the_replicas_to_read_with_their_peer_keys() -> None:
    snap, _ = converged(replicas=2)
    planned = plan_of(with_ips(snap, ready={1: False}))
    [target] = planned.speed_targets
    assert (target.model, target.replica, target.ip) == ("ai/qwen3", 0, "10.85.0.10")
    assert target.peer.model == "qwen3:1.7b" and target.peer.threads == 4
    assert target.peer.cpu == ("Intel", "6", "143")


def test_only_a_replica_running_the_operators_gateway_image_is_vouched_for() -> None:
    own, _ = converged(replicas=1)
    [target] = plan_of(with_ips(own)).speed_targets
    assert target.vouched is True
    theirs, _ = converged(replicas=1, gateway={"image": "tenant.example/gateway:1"})
    [target] = plan_of(with_ips(theirs)).speed_targets
    assert target.vouched is False
    # What counts is the image the pod runs, not the spec: a pod the tenant
    # patched to another gateway image is not vouched for (nor a rolled-back
    # spec's pod that still runs the tenant's image).
    patched = with_ips(own)
    for c in patched.pods[0]["spec"]["containers"]:
        if c.get("name") == CONTAINER_GATEWAY:
            c["image"] = "tenant.example/gateway:1"
    [target] = plan_of(patched).speed_targets
    assert target.vouched is False


def test_no_ip_or_no_gateway_no_read() -> None:
    snap, _ = converged(replicas=1)
    assert plan_of(snap).speed_targets == ()  # kwok-like: Ready, no pod IP yet
    gatewayless, _ = converged(replicas=1, gateway={"enabled": False})
    assert plan_of(with_ips(gatewayless)).speed_targets == ()


def test_a_node_without_cpu_model_labels_has_no_cpu_key() -> None:
    observed = observe(Snapshot(nodes=[NODE.manifest()]))
    assert cpu_model(observed.nodes["n0"]) is None


def test_published_numbers_reach_status_with_the_condition() -> None:
    snap, _ = converged(replicas=1)
    snap = with_ips(snap)
    slow = Published(Rates(25.0, 180.0), Rates(8.0, 150.0),
                     Expected(25.0, 180.0, "own calibration"), True, 1764626400.0)
    [work] = plan_of(snap, {"ai/qwen3": {0: slow}}).work
    speed = work.status.placements[0].speed
    assert speed is not None and speed.slow and speed.measured_at == "2025-12-01T22:00:00Z"
    [cond] = [c for c in work.status.conditions if c.type == ConditionType.SLOW_REPLICA.value]
    assert cond.status.value == "True" and "8 tok/s" in cond.message
    [quiet] = plan_of(snap).work
    assert not any(c.type == ConditionType.SLOW_REPLICA.value for c in quiet.status.conditions)


def test_a_model_with_idle_is_read_at_least_every_quarter_of_after_and_others_as_before() -> None:
    sleepy, _ = converged(replicas=1, idle={"after": "2m"})
    [target] = plan_of(with_ips(sleepy)).speed_targets
    assert target.read_every == 30.0
    plain, _ = converged(replicas=1)
    [target] = plan_of(with_ips(plain)).speed_targets
    assert target.read_every is None
