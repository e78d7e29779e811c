"""What must change (controller/changes.py), as a table over observed worlds.

Each world is built the way the operator sees it: objects rendered by the real
pipeline, then "stored" (uid, nodeName, Ready condition added as the API
server and kubelet would) and read back through `observe`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from localmodel.contract import ANNOTATION_POD_SPEC_HASH
from localmodel.controller.changes import (
    Apply,
    Create,
    Delete,
    ModelChanges,
    choose_claim,
    model_changes,
    with_applied_hash,
)
from localmodel.controller.observed import Observed, current_placements, readiness
from localmodel.controller.parse_memo import Parsed
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.desired import ModelResult
from localmodel.idle.decide import IdleInputs
from localmodel.incremental import Desired
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

UID = "uid-qwen3"
NOW = "2026-12-01T00:00:00Z"
Raw = dict[str, Any]


QWEN = (MakeLocalModel("qwen3").uid(UID).generation(1)
        .spec(model="qwen3:1.7b", cpu=4, context=4096, replicas=1))
NODE = MakeNode("n0").cpu_flags({"AVX2"}).registered()


def local_pv(name: str, node_name: str) -> Raw:
    return {
        "metadata": {"name": name},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}]}}},
    }


def stored(manifest: Raw, *, node_name: str | None = None, ready: bool = True,
           terminating: bool = False, volume: str | None = None) -> Raw:
    """What the API server holds after a create (and the scheduler/kubelet acted)."""
    obj = copy.deepcopy(manifest)
    meta = obj["metadata"]
    meta["uid"] = f"uid-{meta['name']}"
    if terminating:
        meta["deletionTimestamp"] = NOW
    if obj["kind"] == "Pod":
        obj["spec"]["nodeName"] = node_name or meta["annotations"]["localmodel.dev/node"]
        obj["status"] = {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}
    if obj["kind"] == "PersistentVolumeClaim" and volume:
        obj["spec"]["volumeName"] = volume
    return obj


def plan(snap: Snapshot) -> tuple[Observed, ModelResult]:
    """The model's result as the operator works it out (a fresh `Desired`:
    digests, and manifests only when read)."""
    obs = observe(snap)
    state = Desired().state(
        obs.valid_models(), list(obs.nodes.values()), now=NOW,
        current=current_placements(obs), usage=obs.usage, ready=readiness(obs),
        claims=lambda lm, r, n: choose_claim(lm, r, n, obs),
    )
    [result] = state.models
    return obs, result


def converged(replicas: int = 1, nodes: int = 3, **spec: Any) -> tuple[Snapshot, ModelResult]:
    """A world where every desired object exists, stored, Ready."""
    snap = Snapshot(localmodels=[QWEN.replicas(replicas).spec(**spec).manifest()],
                    nodes=[NODE.named(f"n{i}").manifest() for i in range(nodes)])
    _, result = plan(snap)
    objects = [with_applied_hash(o) if o["kind"] in ("ConfigMap", "Service", "NetworkPolicy")
               else o
               for o in result.objects]
    return _with(snap, objects), result


def _with(snap: Snapshot, objects: list[Raw], **kw: Any) -> Snapshot:
    by_kind: dict[str, list[Raw]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(stored(o, **kw))
    return Snapshot(
        localmodels=snap.localmodels, nodes=snap.nodes, volumes=snap.volumes,
        pods=[*snap.pods, *by_kind.get("Pod", [])],
        claims=[*snap.claims, *by_kind.get("PersistentVolumeClaim", [])],
        configmaps=[*snap.configmaps, *by_kind.get("ConfigMap", [])],
        services=[*snap.services, *by_kind.get("Service", [])],
        networkpolicies=[*snap.networkpolicies, *by_kind.get("NetworkPolicy", [])],
    )


def changes_of(snap: Snapshot) -> ModelChanges:
    obs, result = plan(snap)
    return model_changes(result, UID, obs)


def summary(ch: ModelChanges) -> list[str]:
    out = []
    for c in ch.changes:
        if isinstance(c, Delete):
            out.append(f"delete {c.kind} {c.name}")
        else:
            verb = "create" if isinstance(c, Create) else "apply"
            out.append(f"{verb} {c.manifest['kind']} {c.manifest['metadata']['name']}")
    return sorted(out)


# ---- the table ----------------------------------------------------------------


def world_empty() -> Snapshot:
    return Snapshot(localmodels=[QWEN.replicas(2).manifest()],
                    nodes=[NODE.manifest(), NODE.named("n1").manifest()])


def world_converged() -> Snapshot:
    return converged(2)[0]


def world_cpu_changed() -> Snapshot:
    snap, _ = converged(3)
    return Snapshot(**{**snap.__dict__, "localmodels": [QWEN.replicas(3).cpu(2).manifest()]})


def world_cpu_changed_one_replaced_not_ready() -> Snapshot:
    """Replica 0 already runs the new spec but is not Ready yet: nothing else rolls."""
    snap, _ = converged(3)
    new = Snapshot(**{**snap.__dict__, "localmodels": [QWEN.replicas(3).cpu(2).manifest()]})
    _, result = plan(new)
    pod0 = next(o for o in result.objects if o["kind"] == "Pod"
                and o["metadata"]["name"] == "qwen3-0")
    pods = [p for p in new.pods if p["metadata"]["name"] != "qwen3-0"]
    pods.append(stored(pod0, ready=False))
    return Snapshot(**{**new.__dict__, "pods": pods})


def world_scaled_down() -> Snapshot:
    snap, _ = converged(3)
    return Snapshot(**{**snap.__dict__, "localmodels": [QWEN.manifest()]})


def world_node_gone() -> Snapshot:
    snap, result = converged(1, nodes=2)
    gone = result.replicas[0].node
    return Snapshot(**{**snap.__dict__, "nodes": [n for n in snap.nodes
                                                  if n["metadata"]["name"] != gone]})


def world_terminating_pod() -> Snapshot:
    snap, result = converged(1)
    pods = [stored(o, terminating=True) for o in result.objects if o["kind"] == "Pod"]
    return Snapshot(**{**snap.__dict__, "pods": pods})


def world_service_edited() -> Snapshot:
    """Someone changed our Service (its recorded hash no longer matches the spec)."""
    snap, _ = converged(1)
    services = copy.deepcopy(list(snap.services))
    services[0]["metadata"]["annotations"]["localmodel.dev/applied-hash"] = "stale"
    return Snapshot(**{**snap.__dict__, "services": services})


def world_retain_flipped() -> Snapshot:
    snap, _ = converged(1)  # retained (default): claims without owner
    unretained = QWEN.spec(storage={"retain": False}).manifest()
    return Snapshot(**{**snap.__dict__, "localmodels": [unretained]})


def world_foreign_pod_same_labels_no_owner() -> Snapshot:
    """A pod with our labels but no LocalModel owner is not ours: never touched."""
    snap, result = converged(1)
    foreign = stored(next(o for o in result.objects if o["kind"] == "Pod"))
    foreign["metadata"]["name"] = "qwen3-7"
    foreign["metadata"]["labels"]["localmodel.dev/replica"] = "7"
    foreign["metadata"].pop("ownerReferences", None)
    return Snapshot(**{**snap.__dict__, "pods": [*snap.pods, foreign]})


GUARDED = {"networkPolicy": {"enabled": True, "namespaces": ["apps"]}}


def world_policy_asked() -> Snapshot:
    snap, _ = converged(1)
    return Snapshot(**{**snap.__dict__, "localmodels": [QWEN.spec(gateway=GUARDED).manifest()]})


def world_policy_converged() -> Snapshot:
    return converged(1, gateway=GUARDED)[0]


def world_policy_changed() -> Snapshot:
    snap, _ = converged(1, gateway=GUARDED)
    other = {"networkPolicy": {"enabled": True, "namespaces": ["apps", "web"]}}
    return Snapshot(**{**snap.__dict__, "localmodels": [QWEN.spec(gateway=other).manifest()]})


def world_policy_turned_off() -> Snapshot:
    snap, _ = converged(1, gateway=GUARDED)
    off = {"networkPolicy": {"enabled": False}}
    return Snapshot(**{**snap.__dict__, "localmodels": [QWEN.spec(gateway=off).manifest()]})


TABLE: list[tuple[str, Callable[[], Snapshot], list[str], bool]] = [
    ("nothing exists: create everything", world_empty, [
        "create ConfigMap qwen3-modelfile", "create PersistentVolumeClaim qwen3-weights-0",
        "create PersistentVolumeClaim qwen3-weights-1", "create Pod qwen3-0",
        "create Pod qwen3-1", "create Service qwen3"], True),
    ("everything exists and is Ready: nothing", world_converged, [], False),
    ("cpu changed: one replica at a time (the configmap is re-applied)", world_cpu_changed,
     ["apply ConfigMap qwen3-modelfile", "delete Pod qwen3-0"], True),
    ("the replaced replica is not Ready yet: no second replacement",
     world_cpu_changed_one_replaced_not_ready, ["apply ConfigMap qwen3-modelfile"], True),
    ("scaled 3 -> 1: pods of replicas 1 and 2 go; retained claims stay", world_scaled_down,
     ["apply ConfigMap qwen3-modelfile", "delete Pod qwen3-1", "delete Pod qwen3-2"], False),
    ("node gone: its pod is deleted at once", world_node_gone, ["delete Pod qwen3-0"], True),
    ("old pod still terminating: wait, create nothing", world_terminating_pod, [], True),
    ("our Service was edited: re-applied", world_service_edited, ["apply Service qwen3"], False),
    ("storage.retain flipped to false: claim ownership applied", world_retain_flipped,
     ["apply PersistentVolumeClaim qwen3-weights-0"], False),
    ("a look-alike pod without our owner: untouched", world_foreign_pod_same_labels_no_owner,
     [], False),
    ("a NetworkPolicy asked: created", world_policy_asked,
     ["create NetworkPolicy qwen3"], False),
    ("the NetworkPolicy exists: nothing", world_policy_converged, [], False),
    ("its namespaces changed: re-applied", world_policy_changed,
     ["apply NetworkPolicy qwen3"], False),
    ("turned off: deleted", world_policy_turned_off, ["delete NetworkPolicy qwen3"], False),
]


@pytest.mark.parametrize(("world", "expected", "rolling"),
                         [(w, e, r) for _, w, e, r in TABLE], ids=[t[0] for t in TABLE])
def test_changes_table(world: Callable[[], Snapshot], expected: list[str], rolling: bool) -> None:
    ch = changes_of(world())
    assert summary(ch) == expected
    assert (ch.rolling is not None) == rolling, ch.rolling


def test_replaced_pod_carries_an_event_naming_the_reason() -> None:
    ch = changes_of(world_cpu_changed())
    [delete] = [c for c in ch.changes if isinstance(c, Delete)]
    assert delete.event is not None and "spec changed" in delete.event.message
    assert delete.uid == "uid-qwen3-0"  # precondition: never a newer pod of that name


def test_roll_converges_one_replica_at_a_time() -> None:
    """Drive a roll to the end: each step deletes at most one pod, a deleted pod is
    re-created with the new spec, and the world ends with every pod on the new hash."""
    snap, _ = converged(3)
    snap = Snapshot(**{**snap.__dict__, "localmodels": [QWEN.replicas(3).context(8192).manifest()]})
    deletions = []
    for _ in range(20):
        obs, result = plan(snap)
        ch = model_changes(result, UID, obs)
        deletes = [c for c in ch.changes if isinstance(c, Delete) and c.kind == "Pod"]
        creates = [c for c in ch.changes if isinstance(c, Create)
                   and c.manifest["kind"] == "Pod"]
        assert len(deletes) <= 1
        if not deletes and not creates:
            break
        deletions += [d.name for d in deletes]
        pods = [p for p in snap.pods if p["metadata"]["name"] not in {d.name for d in deletes}]
        pods += [stored(c.manifest) for c in creates]
        snap = Snapshot(**{**snap.__dict__, "pods": pods})
    assert sorted(deletions) == ["qwen3-0", "qwen3-1", "qwen3-2"]
    _, result = plan(snap)
    want = {o["metadata"]["name"]: o["metadata"]["annotations"][ANNOTATION_POD_SPEC_HASH]
            for o in result.objects if o["kind"] == "Pod"}
    have = {p["metadata"]["name"]: p["metadata"]["annotations"][ANNOTATION_POD_SPEC_HASH]
            for p in snap.pods}
    assert have == want


def test_moved_replica_gets_a_new_claim_when_the_old_volume_cannot_follow() -> None:
    """The replica's claim is bound to a local PV on the gone node: a new claim (a
    new name) is made for the new node; the retained old claim is kept."""
    snap = Snapshot(localmodels=[QWEN.manifest()],
                    nodes=[NODE.manifest(), NODE.named("n1").manifest()],
                    volumes=[local_pv("pv-n0", "n0"), local_pv("pv-n1", "n1")])
    _, result = plan(snap)
    first = result.replicas[0].node
    other = "n1" if first == "n0" else "n0"
    objs = [o for o in result.objects if o["kind"] in ("Pod", "PersistentVolumeClaim")]
    world = _with(snap, [o for o in objs if o["kind"] == "Pod"])
    world = _with(world, [o for o in objs if o["kind"] == "PersistentVolumeClaim"],
                  volume=f"pv-{first}")
    world = Snapshot(**{**world.__dict__, "nodes": [NODE.named(other).manifest()]})
    obs, result2 = plan(world)
    assert result2.replicas[0].node == other
    ch = model_changes(result2, UID, obs)
    assert "create PersistentVolumeClaim qwen3-weights-0-1" in summary(ch)
    assert "delete Pod qwen3-0" in summary(ch)
    assert not any(isinstance(c, Delete) and c.kind == "PersistentVolumeClaim"
                   for c in ch.changes)  # retained: never deleted
    pod = next(o for o in result2.objects if o["kind"] == "Pod")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["qwen3-weights-0-1"]


def test_unretained_claim_left_behind_is_deleted_once_unused() -> None:
    snap = Snapshot(localmodels=[QWEN.spec(storage={"retain": False}).manifest()],
                    nodes=[NODE.manifest(), NODE.named("n1").manifest()],
                    volumes=[local_pv("pv-n0", "n0"), local_pv("pv-n1", "n1")])
    _, result = plan(snap)
    first = result.replicas[0].node
    other = "n1" if first == "n0" else "n0"
    claims = [o for o in result.objects if o["kind"] == "PersistentVolumeClaim"]
    world = _with(snap, claims, volume=f"pv-{first}")  # no pod: it is gone already
    world = Snapshot(**{**world.__dict__, "nodes": [NODE.named(other).manifest()]})
    ch = changes_of(world)
    assert "delete PersistentVolumeClaim qwen3-weights-0" in summary(ch)


def test_a_sleepers_unretained_home_claim_stays_when_it_wakes_on_another_node() -> None:
    """A model with `spec.idle` woken away from home (its home node full): the
    new node gets a new claim and the claim at home stays, as its wake cost
    says ("the claim on <home> is kept"), even with `storage.retain: false`:
    its weights are there for the next wake at home."""
    sleeper = QWEN.spec(storage={"retain": False}, idle={"after": "1m"})
    snap = Snapshot(localmodels=[sleeper.manifest()],
                    nodes=[NODE.manifest(), NODE.named("n1").manifest()],
                    volumes=[local_pv("pv-n0", "n0"), local_pv("pv-n1", "n1")])
    _, result = plan(snap)
    first = result.replicas[0].node
    other = "n1" if first == "n0" else "n0"
    claims = [o for o in result.objects if o["kind"] == "PersistentVolumeClaim"]
    world = _with(snap, claims, volume=f"pv-{first}")  # released: no pod
    world = Snapshot(**{**world.__dict__, "nodes": [NODE.named(other).manifest()]})
    ch = changes_of(world)
    assert "create PersistentVolumeClaim qwen3-weights-0-1" in summary(ch)
    assert not any(isinstance(c, Delete) and c.kind == "PersistentVolumeClaim"
                   for c in ch.changes), summary(ch)


def test_unbound_claim_is_reused_on_any_node() -> None:
    snap = Snapshot(localmodels=[QWEN.manifest()], nodes=[NODE.manifest()])
    _, result = plan(snap)
    claims = [o for o in result.objects if o["kind"] == "PersistentVolumeClaim"]
    obs = observe(_with(snap, claims))
    lm = obs.valid_models()[0]
    assert choose_claim(lm, 0, "n0", obs) == "qwen3-weights-0"


def test_apply_never_targets_an_object_owned_by_another_model_uid() -> None:
    snap, _ = converged(1)
    services = copy.deepcopy(list(snap.services))
    services[0]["metadata"]["annotations"]["localmodel.dev/applied-hash"] = "stale"
    services[0]["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    world = Snapshot(**{**snap.__dict__, "services": services})
    assert not [c for c in changes_of(world).changes if isinstance(c, Apply)]


def test_a_model_recreated_with_a_new_uid_leaves_old_pods_to_garbage_collection() -> None:
    snap, _ = converged(1)
    world = Snapshot(**{**snap.__dict__, "localmodels": [QWEN.uid("uid-new").manifest()]})
    obs, result = plan(world)
    ch = model_changes(result, "uid-new", obs)
    assert not [c for c in ch.changes if isinstance(c, Delete)]


def test_unschedulable_pods_say_whether_another_node_could_help() -> None:
    from localmodel.controller.observed import unschedulable

    snap, result = converged(1)
    pod = stored(next(o for o in result.objects if o["kind"] == "Pod"))
    del pod["spec"]["nodeName"]

    def stuck_with(message: str) -> list[Any]:
        p = copy.deepcopy(pod)
        p["status"] = {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": "2026-12-01T00:00:00Z", "message": message}]}
        return unschedulable(observe(Snapshot(**{**snap.__dict__, "pods": [p]})))

    [node_full] = stuck_with("0/3 nodes are available: 1 node(s) didn't find available "
                             "persistent volumes to bind, 2 node(s) didn't match Pod's "
                             "node affinity/selector.")
    assert node_full.node == result.replicas[0].node and node_full.node_specific
    assert node_full.since == 1796083200.0  # 2026-12-01T00:00:00Z
    [no_class] = stuck_with("0/3 nodes are available: pod has unbound immediate "
                            "PersistentVolumeClaims. preemption: 0/3 nodes are available")
    assert not no_class.node_specific
    assert stuck_with("") != [] and unschedulable(observe(snap)) == []


def _versioned(body: Raw, rv: str) -> Raw:
    meta = {**body["metadata"], "uid": body["metadata"].get("uid", "u-" + body["metadata"]["name"]),
            "resourceVersion": rv}
    return {**body, "metadata": meta}


def test_each_stored_version_of_a_model_or_node_is_parsed_once() -> None:
    parsed = Parsed()
    lm, n1 = _versioned(QWEN.manifest(), "1"), _versioned(NODE.named("n1").manifest(), "7")
    bad = _versioned({"metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "lots"}}}, "3")
    first = observe(Snapshot(localmodels=[lm], nodes=[n1, bad]), parsed=parsed)
    again = observe(Snapshot(localmodels=[copy.deepcopy(lm)], nodes=[n1, bad]), parsed=parsed)
    key = next(iter(first.models))
    assert again.models[key] is first.models[key]  # the same parsed object
    assert again.nodes["n1"] is first.nodes["n1"]
    assert again.bad_nodes == first.bad_nodes and "n2" in again.bad_nodes
    edited = _versioned(QWEN.replicas(2).manifest(), "2")
    third = observe(Snapshot(localmodels=[edited], nodes=[]), parsed=parsed)
    assert third.models[key].model is not None and third.models[key].model.spec.replicas == 2
    assert third.nodes == {} and len(parsed.models) == 1 and parsed.nodes == {}  # forgotten
    assert observe(Snapshot(localmodels=[edited])) == observe(Snapshot(localmodels=[edited]),
                                                              parsed=Parsed())


def test_manifests_are_made_only_for_objects_to_write() -> None:
    """The changes compare digests: where everything exists, no manifest is made
    (a pass at 10k nodes would otherwise build and keep tens of thousands of
    them); a missing pod is created from the manifest the renderer makes."""
    snap, _ = converged(2)
    obs, result = plan(snap)
    assert model_changes(result, UID, obs).changes == ()
    assert "objects" not in vars(result), "a converged model's manifests were made"
    missing = Snapshot(**{**snap.__dict__, "pods": [
        p for p in snap.pods if p["metadata"]["name"] != "qwen3-1"]})
    obs, result = plan(missing)
    [create] = model_changes(result, UID, obs).changes
    assert isinstance(create, Create)
    rendered = next(o for o in result.objects if o["metadata"]["name"] == "qwen3-1")
    assert create.manifest is rendered
    assert (create.manifest["metadata"]["annotations"][ANNOTATION_POD_SPEC_HASH]
            == result.pod_hashes[1])


def test_a_released_model_loses_its_pods_by_the_scale_down_path_and_keeps_every_claim() -> None:
    """Asleep and released (`IdleInputs.released`): each replica's pod goes,
    no pod is created, and each claim stays, even an owned one."""
    snap, _ = converged(2, storage={"retain": False})
    obs = observe(snap)
    [lm] = obs.valid_models()
    state = Desired().state(
        [lm], list(obs.nodes.values()), now=NOW, current=current_placements(obs),
        usage=obs.usage, ready=readiness(obs), claims=lambda m, r, n: choose_claim(m, r, n, obs),
        idle=IdleInputs(released=frozenset({lm.key})))
    [result] = state.models
    assert result.released and not result.replicas
    ch = model_changes(result, UID, obs)
    assert summary(ch) == ["delete Pod qwen3-0", "delete Pod qwen3-1"]
    assert all(isinstance(c, Delete) and c.why.startswith("asleep") for c in ch.changes)
