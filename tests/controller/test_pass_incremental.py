"""The operator's pass kept between passes equals the pass worked out afresh.

The reconciler keeps `observe`'s readings (`parse_memo.Parsed`: each section of
the snapshot and each object's reading, by identity) and each model's share of
a pass (`work_memo.KeptWork`: changes, status, claims chosen, the admin
policy's verdict, and the whole last plan for the very same inputs), so a pass
costs what changed. Here a world of stored objects, kept the way a watch's
index keeps them (an object replaced on each event, the others left as the
very same objects), goes through random sequences of events: models added,
removed, edited and given the status the pass wrote; nodes relabelled, resized,
cordoned, added and removed; the pass's own creates, applies and deletes
arriving (some of them); pods becoming Ready or Unschedulable, marked for
deletion, their spec hash edited, or deleted by someone else; applied objects
edited; claims bound to volumes or deleted; objects re-listed as equal copies;
a doorman pod appearing for any model; the clock moving or not; the admin's
policy refusing some models or none;
for models with `spec.idle`, what the shell gathered (`IdleSignals`: activity
readings quiet, busy, stale or missing, requests held at routers, answers to
closes) moving, so models sleep, are released (their doormen made), wake
(their doormen deleted at the first Ready replica) and yield. At every step
the long-lived `Parsed`, `Desired` and `KeptWork` give exactly what fresh ones
give: the same `Observed` and plan."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localmodel.api import parse_local_model
from localmodel.contract import ANNOTATION_APPLIED_HASH, ANNOTATION_NODE, ANNOTATION_POD_SPEC_HASH
from localmodel.controller.changes import Apply, Create, Delete
from localmodel.controller.model_work import PassPlan
from localmodel.controller.observed import Observed, current_placements, readiness, unschedulable
from localmodel.controller.parse_memo import Parsed
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.work_memo import KeptWork
from localmodel.gateway_contract.waiting_answer import WaitingModel
from localmodel.idle.asks import CloseAsk, Closed, CloseResult, IdleSignals
from localmodel.incremental import Desired
from localmodel.render import RenderOptions
from localmodel.render.doorman import doorman_pod
from localmodel.speed import Activity, Rates, Totals
from localmodel.speed import Reading as SpeedReading
from localmodel.status import status_body
from localmodel.tenancy import TenantPolicy
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

SEQUENCES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STEPS = 12
OPTIONS = RenderOptions(operator_image="localmodel-operator:test", network_policy=True)
SPECS: list[dict[str, Any]] = [
    {"model": "qwen3:0.6b", "cpu": 2},
    {"model": "gemma3:1b", "cpu": 1, "replicas": 2, "placement": {"exclusive": False}},
    {"model": "qwen3:1.7b", "cpu": 2, "placement": {"nodeSelector": {"pool": "a"}}},
    {"model": "qwen3:0.6b", "cpu": 1, "gateway": {"enabled": False},
     "placement": {"exclusive": False}},
    {"model": "unknown-model:7b", "cpu": 1},  # invalid: memory auto, not in the catalog
    {"model": "qwen3:0.6b", "cpu": 1, "placement": {"exclusive": False},
     "idle": {"after": "1m", "release": "WhenAsleep"}},
    {"model": "gemma3:1b", "cpu": 2, "replicas": 2, "idle": {"after": "2m", "priority": 5}},
    {"model": "qwen3:0.6b", "cpu": 1, "replicas": 0, "idle": {"after": "1m"}},  # off
]
KINDS = {"Pod": "pods", "PersistentVolumeClaim": "claims", "ConfigMap": "configmaps",
         "Service": "services", "NetworkPolicy": "networkpolicies"}
TIMES = ["2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:01:00Z"]
EPOCH = 1767225600.0  # TIMES[0]
RESULTS = list(CloseResult)


class World:
    """Stored objects as the watches' indexes keep them: name -> uid -> object."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.store: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in (
            "localmodels", "nodes", "pods", "claims", "configmaps", "services",
            "networkpolicies", "volumes")}
        self.rv = 0
        self.now = TIMES[0]
        # The admin's policy: none, or one that refuses exclusive models outside "other".
        self.tenants = TenantPolicy()
        self.idle: IdleSignals | None = None  # what the shell gathered for idle models
        for i in range(rnd.randint(2, 4)):
            self.node(f"n{i}")
        for i in range(rnd.randint(1, 4)):
            self.model(f"m{i}")
        if rnd.random() < 0.7:
            self.idle = self.signals()

    def stamp(self, body: dict[str, Any], uid: str) -> dict[str, Any]:
        self.rv += 1
        body["metadata"] = {**body["metadata"], "uid": uid, "resourceVersion": str(self.rv)}
        return body

    def node(self, name: str) -> None:
        make = MakeNode(name).cpus(self.rnd.choice([4, 8])).memory_gib(16).registered()
        make = make.cpu_flags({"AVX2"}).labels(pool=self.rnd.choice(["a", "b"]))
        if self.rnd.random() < 0.2:
            make = make.unschedulable()
        self.store["nodes"][f"uid-{name}"] = self.stamp(make.manifest(), f"uid-{name}")

    def model(self, name: str, spec: dict[str, Any] | None = None) -> None:
        body = (MakeLocalModel(name).namespace("ns").uid(f"uid-{name}").generation(1)
                .spec(**(spec or self.rnd.choice(SPECS))).manifest())
        self.store["localmodels"][f"uid-{name}"] = self.stamp(body, f"uid-{name}")

    def snapshot(self) -> Snapshot:
        return Snapshot(**{k: list(v.values()) for k, v in self.store.items()})

    def write(self, plan: PassPlan) -> None:
        """Some of what the pass wanted arrives in the watches (as the API makes it)."""
        for w in plan.work:
            for change in w.changes.changes:
                if self.rnd.random() < 0.7:
                    self.made(change)
            if self.rnd.random() < 0.7 and w.model.uid in self.store["localmodels"]:
                old = self.store["localmodels"][w.model.uid]
                self.store["localmodels"][w.model.uid] = self.stamp(
                    {**old, "status": status_body(w.status)}, w.model.uid)

    def made(self, change: Create | Apply | Delete) -> None:
        kind, ns, name = change.target
        bucket = self.store[KINDS[kind]]
        uid = f"uid-{kind}-{ns}-{name}"
        if isinstance(change, Delete):
            bucket.pop(change.uid, None)
            return
        body = copy.deepcopy(change.manifest)
        if kind == "Pod":  # a replica's on its planned node; a doorman where the scheduler put it
            planned = body["metadata"].get("annotations", {}).get(ANNOTATION_NODE)
            body["spec"]["nodeName"] = planned or self.rnd.choice(["n0", "n1", "n2"])
            body["status"] = {"phase": "Pending", "conditions": []}
        bucket[uid] = self.stamp(body, uid)

    def event(self) -> None:
        rnd, store = self.rnd, self.store
        what = rnd.randrange(17)
        models, nodes, pods = store["localmodels"], store["nodes"], store["pods"]
        if what == 0:
            self.model(f"m{rnd.randint(0, 5)}")  # added, or edited (a new spec)
        elif what == 1 and models:
            models.pop(rnd.choice(sorted(models)))
        elif what == 2 and nodes:  # relabelled
            uid = rnd.choice(sorted(nodes))
            body = copy.deepcopy(nodes[uid])
            body["metadata"]["labels"]["pool"] = rnd.choice(["a", "b", "c"])
            nodes[uid] = self.stamp(body, uid)
        elif what == 3:
            self.node(f"n{rnd.randint(0, 5)}")  # added, or resized and cordoned
        elif what == 4 and nodes:
            nodes.pop(rnd.choice(sorted(nodes)))
        elif what == 5 and pods:  # Ready
            uid = rnd.choice(sorted(pods))
            body = copy.deepcopy(pods[uid])
            body["status"] = {"phase": "Running", "podIP": "10.0.0.9",
                              "conditions": [{"type": "Ready", "status": "True"}]}
            pods[uid] = self.stamp(body, uid)
        elif what == 6 and pods:  # Unschedulable
            uid = rnd.choice(sorted(pods))
            body = copy.deepcopy(pods[uid])
            body["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "0/3 nodes"}]}
            pods[uid] = self.stamp(body, uid)
        elif what == 7 and pods:
            pods.pop(rnd.choice(sorted(pods)))  # deleted by someone else
        elif what == 8:  # re-listed: equal copies, new objects
            name = rnd.choice(sorted(store))
            store[name] = {uid: copy.deepcopy(b) for uid, b in store[name].items()}
        elif what == 9:
            self.now = rnd.choice(TIMES)
        elif what == 10 and pods:  # being deleted, or someone edited its spec hash
            self.edit("pods", lambda meta: meta.update(deletionTimestamp="2026-01-01T00:00:09Z")
                      if rnd.random() < 0.5 else meta["annotations"].update(
                          {ANNOTATION_POD_SPEC_HASH: "edited"}))
        elif what == 11:  # someone edited an applied object
            self.edit(rnd.choice(["configmaps", "services", "networkpolicies"]),
                      lambda meta: meta["annotations"].update({ANNOTATION_APPLIED_HASH: "x"}))
        elif what == 12 and store["claims"]:  # a claim bound, or deleted by someone
            if rnd.random() < 0.5:
                store["claims"].pop(rnd.choice(sorted(store["claims"])))
            else:
                self.edit("claims", lambda meta: None, volume=f"pv-{rnd.randint(0, 2)}")
        elif what == 14:  # the admin's policy changed (or was set again, an equal copy)
            self.tenants = TenantPolicy(exclusive_namespaces=rnd.choice([("ns",), ("other",)]))
        elif what == 15:  # the idle signals moved
            self.idle = self.signals()
        elif what == 16 and models:  # a doorman there (an earlier pass's, for any model)
            body = models[rnd.choice(sorted(models))]
            lm = parse_local_model({k: v for k, v in body.items() if k != "status"})
            self.made(Create(doorman_pod(lm, OPTIONS)))
        # 13: nothing happened (a quiet pass)

    def signals(self) -> IdleSignals:
        """Random signals for the world's models: readings quiet, busy, stale
        or missing; requests held; answers to closes (the pass's or others')."""
        rnd = self.rnd
        now = EPOCH + rnd.choice([0, 5, 60, 200, 4000])
        names = sorted(b["metadata"]["name"] for b in self.store["localmodels"].values())
        readings = {}
        for name in names:
            readings[f"ns/{name}"] = {r: SpeedReading(
                now - rnd.choice([0, 0, 500]), Rates(), Totals(),
                activity=rnd.choice([None, Activity(idle_seconds=1000.0),
                                     Activity(in_flight=1), Activity(idle_seconds=40.0)]))
                for r in range(2) if rnd.random() < 0.8}
        waiting = {f"ns/{n}": WaitingModel(f"ns/{n}", rnd.randint(1, 3), 0, 2.0)
                   for n in names if rnd.random() < 0.3}
        closes = {}
        for name in names:
            for r in range(2):
                if rnd.random() < 0.5:
                    ask = CloseAsk("ns", name, f"{name}-{r}", rnd.choice(["sleep", "yield"]),
                                   0, for_=rnd.choice(["", *(f"ns/{n}" for n in names)]),
                                   node=rnd.choice(["", "n0", "n1"]))
                    closes[f"ns/{name}-{r}"] = Closed(ask, rnd.choice(RESULTS),
                                                      now - rnd.choice([1, 20, 90]),
                                                      lease_seconds=60.0)
        return IdleSignals(now, waiting, closes, readings)

    def edit(self, name: str, change: Any, volume: str | None = None) -> None:
        """One object of `name` replaced by an edited copy."""
        bucket = self.store[name]
        if not bucket:
            return
        uid = self.rnd.choice(sorted(bucket))
        body = copy.deepcopy(bucket[uid])
        body["metadata"].setdefault("annotations", {})
        change(body["metadata"])
        if volume is not None:
            body["spec"]["volumeName"] = volume
            self.store["volumes"].setdefault(volume, {
                "metadata": {"name": volume, "uid": volume, "resourceVersion": "1"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{
                    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                          "values": [self.rnd.choice(["n0", "n1"])]}]}]}}}})
        bucket[uid] = self.stamp(body, uid)


def views(obs: Observed) -> tuple[Any, ...]:
    """What the pass reads of an `Observed` beyond its fields."""
    keys = sorted(obs.models)
    owners = sorted({(o.namespace, o.owner_uid) for o in obs.objects.values()})
    return (current_placements(obs), readiness(obs), unschedulable(obs),
            {k: obs.pods_of(k) for k in keys}, {k: obs.claims_of(k) for k in keys},
            {k: obs.doormen_of(k) for k in keys},
            {o: obs.objects_owned(*o) for o in owners})


@SEQUENCES
@given(st.randoms(use_true_random=False))
def test_a_kept_pass_equals_a_fresh_pass_at_every_step(rnd: random.Random) -> None:
    world = World(rnd)
    parsed, desired, kept = Parsed(), Desired(), KeptWork()
    placed: dict[str, dict[int, str]] = {}
    fresh_placed: dict[str, dict[int, str]] = {}
    for step in range(STEPS):
        snap = world.snapshot()
        obs = observe(snap, (), parsed)
        fresh_obs = observe(snap)
        assert obs == fresh_obs, f"step {step}: observe"
        assert views(obs) == views(fresh_obs), f"step {step}: the views of observe"
        plan = plan_pass(obs, world.now, OPTIONS, placed=placed, avoid={}, desired=desired,
                         kept=kept, tenants=world.tenants, idle=world.idle)
        fresh = plan_pass(fresh_obs, world.now, OPTIONS, placed=fresh_placed, avoid={},
                          tenants=world.tenants, idle=world.idle)
        assert plan == fresh, f"step {step}: plan_pass"
        placed, fresh_placed = plan.placed, fresh.placed
        world.write(fresh)
        for _ in range(rnd.randint(0, 2)):
            world.event()


def test_a_quiet_pass_hands_back_the_last_observed_and_plan() -> None:
    """Nothing changed: the same objects give the same `Observed` and plan back
    (not worked out again); one node relabelled gives a new `Observed` whose
    untouched sections are the last one's."""
    world = World(random.Random(7))
    parsed, desired, kept = Parsed(), Desired(), KeptWork()
    obs = observe(world.snapshot(), (), parsed)
    plan = plan_pass(obs, TIMES[0], OPTIONS, placed={}, avoid={}, desired=desired, kept=kept)
    plan = plan_pass(obs, TIMES[0], OPTIONS, placed=plan.placed, avoid={}, desired=desired,
                     kept=kept)  # (the first pass's placements remembered, as the reconciler)
    again = observe(world.snapshot(), (), parsed)
    assert again is obs
    assert plan_pass(again, TIMES[0], OPTIONS, placed=plan.placed, avoid={}, desired=desired,
                     kept=kept) is plan
    uid = sorted(world.store["nodes"])[0]
    body = copy.deepcopy(world.store["nodes"][uid])
    body["metadata"]["labels"]["pool"] = "c"
    world.store["nodes"][uid] = world.stamp(body, uid)
    relabelled = observe(world.snapshot(), (), parsed)
    assert relabelled is not obs and relabelled.nodes is not obs.nodes
    assert relabelled.pods is obs.pods and relabelled.models is obs.models
    assert relabelled == observe(world.snapshot())
    # only that node's object was read again, and the `Observed` says which changed
    assert relabelled.nodes_since == (obs.nodes, frozenset({body["metadata"]["name"]}))


def test_the_admin_policy_verdicts_are_kept_only_while_models_and_policy_hold() -> None:
    """The admitted models are kept while the models, the policy and the
    Secrets' labels are the very same (only the refused ones asked again): over
    the same `Observed`, a policy changed, set again as an equal copy, or the
    clock moved gives what a fresh pass gives."""
    world = World(random.Random(3))
    for i in range(4):
        world.model(f"m{i}", SPECS[i % 2])  # exclusive ones and shared ones
    parsed, desired, kept = Parsed(), Desired(), KeptWork()
    obs = observe(world.snapshot(), (), parsed)
    placed: dict[str, dict[int, str]] = {}
    refusing = TenantPolicy(exclusive_namespaces=("other",))  # exclusive models in "ns"
    policies = [TenantPolicy(), refusing, refusing, TenantPolicy(exclusive_namespaces=("other",)),
                TenantPolicy(exclusive_namespaces=("ns",)), refusing, TenantPolicy()]
    for step, tenants in enumerate(policies):
        now = TIMES[step % 2]
        plan = plan_pass(obs, now, OPTIONS, placed=placed, avoid={}, desired=desired, kept=kept,
                         tenants=tenants)
        assert plan == plan_pass(obs, now, OPTIONS, placed=placed, avoid={},
                                 tenants=tenants), f"step {step}"
        assert (len(plan.placed) < len(obs.models)) == (tenants == refusing), f"step {step}"
        placed = plan.placed


def settled_world(seed: int) -> tuple[World, Parsed, Desired, KeptWork, PassPlan]:
    """Valid models only, no policy: passes until the pass writes nothing new
    (what it wants has all arrived in the watches)."""
    world = World(random.Random(seed))
    world.store["localmodels"].clear()
    for i in range(5):
        world.model(f"m{i}", SPECS[i % 4])
    parsed, desired, kept = Parsed(), Desired(), KeptWork()
    plan = plan_pass(observe(world.snapshot(), (), parsed), world.now, OPTIONS, placed={},
                     avoid={}, desired=desired, kept=kept)
    for _ in range(6):
        for w in plan.work:
            for change in w.changes.changes:
                world.made(change)
            old = world.store["localmodels"][w.model.uid]
            world.store["localmodels"][w.model.uid] = world.stamp(
                {**old, "status": status_body(w.status)}, w.model.uid)
        plan = plan_pass(observe(world.snapshot(), (), parsed), world.now, OPTIONS,
                         placed=plan.placed, avoid={}, desired=desired, kept=kept)
    return world, parsed, desired, kept, plan


def relabelled(world: World, name: str, **labels: str) -> None:
    uid = f"uid-{name}"
    body = copy.deepcopy(world.store["nodes"][uid])
    body["metadata"]["labels"].update(labels)
    world.store["nodes"][uid] = world.stamp(body, uid)


def test_a_label_pass_works_out_again_only_the_models_on_that_node() -> None:
    """One node relabelled: the pass equals a fresh one, names the work that
    is not the last plan's (`PassPlan.since`), and that is only the work of
    the models whose pods or replicas are on that node (the others' work is
    the very same object); a node no model is on and no model selects: none."""
    for seed in range(6):
        world, parsed, desired, kept, plan = settled_world(seed)
        for name in sorted(n["metadata"]["name"] for n in world.store["nodes"].values()):
            # (settled: each model's pods are where the plan puts its replicas)
            on = {key for key, nodes in plan.placed.items() if name in nodes.values()}
            relabelled(world, name, zone=f"z-{world.rv}")
            obs = observe(world.snapshot(), (), parsed)
            assert obs.nodes_since is not None and obs.nodes_since[1] == {name}
            again = plan_pass(obs, world.now, OPTIONS, placed=plan.placed, avoid={},
                              desired=desired, kept=kept)
            assert again == plan_pass(observe(world.snapshot()), world.now, OPTIONS,
                                      placed=plan.placed, avoid={}), (seed, name)
            assert again.since is not None and again.since[0] == plan.serial
            before = {w.model.key: w for w in plan.work}
            assert set(again.since[1]) <= on, (seed, name, set(again.since[1]), on)
            for w in again.work:
                assert (w is before[w.model.key]) is (w.model.key not in again.since[1])
            plan = again


@SEQUENCES
@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abcdefghij"),
                          st.sampled_from(["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8",
                                           "m9", "m10"])), max_size=80))
def test_the_node_index_holds_what_was_added_and_not_removed(
        ops: list[tuple[bool, str, str]]) -> None:
    """`share_memo.index_node` / `unindex_node` (a tuple while a few models, a set
    beyond) hold the same as a dict of sets."""
    from localmodel.controller.share_memo import index_node as _index
    from localmodel.controller.share_memo import unindex_node as _unindex

    by: dict[str, Any] = {}
    want: dict[str, set[str]] = {}
    for add, node, key in ops:
        if add:
            _index(by, node, key)
            want.setdefault(node, set()).add(key)
        else:
            _unindex(by, node, key)
            want.get(node, set()).discard(key)
            if not want.get(node, True):
                del want[node]
        assert {n: set(keys) for n, keys in by.items()} == want
        assert all(len(set(keys)) == len(keys) for keys in by.values())
