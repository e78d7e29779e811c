"""The idle decisions in the operator's pass (`plan_pass(idle=...)`): a model
with `spec.idle` that its gateway let close is released (its pod deleted by
the scale-down path, its claim kept, not re-created while it sleeps; its
doorman made once the pod is gone, deleted when the first replica is Ready) and
reads Ready=True Asleep with its claim's node, `status.replicas` 0 and
`spec` untouched; an apply of the same spec while it sleeps changes nothing;
a held request wakes it on its home node; a model without `spec.idle` does not
take a released sleeper's home; a waker with no free node asks an idle
borrower to yield, and takes the node it gave; `replicas: 0` is off, with no
idle state at all."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localmodel.contract import ANNOTATION_NODE
from localmodel.controller.changes import Create, Delete
from localmodel.controller.idle_pass import homes, policy_of
from localmodel.controller.model_work import ModelWork, PassPlan
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.gateway_contract.waiting_answer import WaitingModel
from localmodel.idle.asks import CloseAsk, Closed, CloseResult, IdleSignals
from localmodel.idle.decide import epoch
from localmodel.render import RenderOptions
from localmodel.speed import Activity, Rates, Totals
from localmodel.speed import Reading as SpeedReading
from localmodel.status import Reason, status_body
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

OPTIONS = RenderOptions(operator_image="localmodel-operator:test")
NOW = "2026-12-07T23:00:00Z"
T0 = epoch(NOW) or 0.0
SLEEPER = {"model": "qwen3:0.6b", "cpu": 4, "idle": {"after": "30m", "release": "WhenAsleep"}}
BORROWER = {"model": "qwen3:0.6b", "cpu": 4, "idle": {"after": "30m", "priority": 0}}
PLAIN = {"model": "qwen3:0.6b", "cpu": 4}


class Cluster:
    """Stored objects as the watches keep them; every write of a pass arrives."""

    def __init__(self, nodes: tuple[str, ...] = ("n1",)) -> None:
        self.store: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in (
            "localmodels", "nodes", "pods", "claims", "configmaps", "services",
            "networkpolicies", "volumes")}
        self.rv = 0
        self.placed: dict[str, dict[int, str]] = {}
        for name in nodes:
            self.node(name)

    def stamp(self, body: dict[str, Any], uid: str) -> dict[str, Any]:
        self.rv += 1
        body["metadata"] = {**body["metadata"], "uid": uid, "resourceVersion": str(self.rv)}
        return body

    def node(self, name: str) -> None:
        body = MakeNode(name).cpus(8).memory_gib(16).registered().cpu_flags({"AVX2"}).manifest()
        self.store["nodes"][name] = self.stamp(body, f"uid-{name}")

    def model(self, name: str, spec: dict[str, Any], generation: int = 1) -> None:
        old = self.store["localmodels"].get(name)
        body = (MakeLocalModel(name).namespace("ai").uid(f"uid-{name}").generation(generation)
                .spec(**spec).manifest())
        if old is not None and "status" in old:
            body["status"] = copy.deepcopy(old["status"])
        self.store["localmodels"][name] = self.stamp(body, f"uid-{name}")

    def snapshot(self) -> Snapshot:
        return Snapshot(**{k: list(v.values()) for k, v in self.store.items()})

    def run(self, idle: IdleSignals | None) -> PassPlan:
        """One pass; every change and status it wants arrives (pods Ready,
        claims bound to a local volume on their pod's node)."""
        plan = plan_pass(observe(self.snapshot()), NOW, OPTIONS, placed=self.placed, avoid={},
                         idle=idle)
        self.placed = plan.placed
        for w in plan.work:
            for change in w.changes.changes:
                self.made(change)
            name = w.model.name
            self.store["localmodels"][name] = self.stamp(
                {**self.store["localmodels"][name], "status": status_body(w.status)}, w.model.uid)
        return plan

    def made(self, change: Any) -> None:
        kind, _, name = change.target
        bucket = {"Pod": "pods", "PersistentVolumeClaim": "claims", "ConfigMap": "configmaps",
                  "Service": "services", "NetworkPolicy": "networkpolicies"}[kind]
        if isinstance(change, Delete):
            self.store[bucket].pop(name, None)
            return
        body = copy.deepcopy(change.manifest)
        if kind == "Pod":  # a replica's on its planned node; a doorman (none planned) on the first
            node = (body["metadata"].get("annotations", {}).get(ANNOTATION_NODE)
                    or min(self.store["nodes"]))
            body["spec"]["nodeName"] = node
            body["status"] = {"phase": "Running", "podIP": "10.0.0.9",
                              "conditions": [{"type": "Ready", "status": "True"}]}
            self.bind(body, node)
        self.store[bucket][name] = self.stamp(body, f"uid-{kind}-{name}")

    def bind(self, pod: dict[str, Any], node: str) -> None:
        for volume in pod["spec"].get("volumes", ()):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            body = self.store["claims"].get(claim or "")
            if body is None or body["spec"].get("volumeName"):
                continue
            pv = f"pv-{claim}"
            body["spec"]["volumeName"] = pv
            self.store["volumes"][pv] = {
                "metadata": {"name": pv, "uid": pv, "resourceVersion": "1"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{
                    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                          "values": [node]}]}]}}}}


def reading(idle_s: float, in_flight: int = 0) -> SpeedReading:
    return SpeedReading(T0, Rates(), Totals(), activity=Activity(in_flight=in_flight,
                                                                 idle_seconds=idle_s))


def signals(readings: dict[str, float] | None = None, held: dict[str, int] | None = None,
            closes: tuple[Closed, ...] = (), busy: tuple[str, ...] = ()) -> IdleSignals:
    got = {f"ai/{k}": {0: reading(s)} for k, s in (readings or {}).items()}
    got |= {f"ai/{k}": {0: reading(0, 1)} for k in busy}
    waiting = {f"ai/{k}": WaitingModel(f"ai/{k}", n, 0, 3.0) for k, n in (held or {}).items()}
    return IdleSignals(T0, waiting, {f"ai/{c.ask.pod}": c for c in closes}, got)


def closed(ask: CloseAsk) -> Closed:
    """The gateway's 200 closed, answered this second."""
    return Closed(ask, CloseResult.CLOSED, T0, lease_seconds=60.0)


def work(plan: PassPlan, name: str) -> ModelWork:
    return next(w for w in plan.work if w.model.name == name)


def condition(w: ModelWork, type_: str) -> tuple[str, str, str]:
    c = next(c for c in w.status.conditions if c.type == type_)
    return c.status.value, c.reason, c.message


def asleep() -> Cluster:
    """`q` placed on n1, then idle, closed and released."""
    cluster = Cluster()
    cluster.model("q", SLEEPER)
    cluster.run(signals(busy=("q",)))
    cluster.run(signals(busy=("q",)))
    plan = cluster.run(signals({"q": 4000}))
    assert plan.idle.closes == (CloseAsk("ai", "q", "q-0", "sleep", 1800, ip="10.0.0.9"),)
    released = cluster.run(signals({"q": 4000}, closes=(closed(plan.idle.closes[0]),)))
    w = work(released, "q")
    assert [(type(c), c.target.kind) for c in w.changes.changes] == [(Delete, "Pod")]
    return cluster


def test_a_released_model_loses_its_pod_keeps_its_claim_and_reads_ready_asleep() -> None:
    cluster = asleep()
    assert "q-0" not in cluster.store["pods"] and "q-weights-0" in cluster.store["claims"]
    plan = cluster.run(signals())  # the next pass: nothing re-created while asleep...
    w = work(plan, "q")
    # ...but its doorman, once its pod is gone, answers its Service
    assert [(type(c), c.target.name) for c in w.changes.changes] == [(Create, "q-doorman")]
    assert plan.idle.closes == ()
    assert work(cluster.run(signals()), "q").changes.changes == ()
    assert w.status.idle is not None and (w.status.idle.state, w.status.idle.resident) == (
        "Asleep", False)
    assert [(h.node, h.claim) for h in w.status.idle.homes] == [("n1", "q-weights-0")]
    assert condition(w, "Ready")[:2] == ("True", Reason.ASLEEP.value)
    placed = condition(w, "Placed")
    assert placed[:2] == ("True", Reason.ASLEEP.value) and "n1" in placed[2]
    assert condition(w, "Awake")[:2] == ("False", Reason.ASLEEP.value)
    assert w.status.replicas == 0 and w.status.placements == []
    applied = MakeLocalModel("q").namespace("ai").spec(**SLEEPER).manifest()["spec"]
    assert cluster.store["localmodels"]["q"]["spec"] == applied  # sleep never writes spec


def test_an_apply_during_sleep_changes_nothing() -> None:
    cluster = asleep()
    before = work(cluster.run(signals()), "q").status
    cluster.model("q", SLEEPER, generation=2)  # GitOps applies the same spec again
    plan = cluster.run(signals())
    w = work(plan, "q")
    assert w.changes.changes == () and plan.idle.closes == ()
    assert w.status.idle == before.idle and w.status.observed_generation == 2
    assert condition(w, "Ready")[:2] == ("True", Reason.ASLEEP.value)


def test_a_held_request_wakes_it_on_its_home_node() -> None:
    cluster = asleep()
    cluster.node("n0")  # free too, and first by name: the home wins
    plan = cluster.run(signals(held={"q": 2}))
    w = work(plan, "q")
    pods = [c for c in w.changes.changes if isinstance(c, Create) and c.target.kind == "Pod"]
    assert [c.target.name for c in pods] == ["q-0", "q-doorman"]  # (it answers until Ready)
    assert pods[0].manifest["metadata"]["annotations"][ANNOTATION_NODE] == "n1"
    assert w.status.idle is not None and w.status.idle.state == "Waking"
    assert w.status.idle.wake is not None and w.status.idle.wake.cost == "none"
    awake = work(cluster.run(signals(held={"q": 2})), "q")  # its pod Ready
    assert awake.status.idle is not None and awake.status.idle.state == "Awake"
    assert [(type(c), c.target.name) for c in awake.changes.changes] == [
        (Delete, "q-doorman")]
    assert awake.status.idle.wakes == 1 and awake.status.replicas == 1


def test_a_model_that_never_sleeps_does_not_take_a_released_sleepers_home() -> None:
    cluster = asleep()
    cluster.model("embed", PLAIN)
    w = work(cluster.run(signals()), "embed")
    assert condition(w, "Placed")[0] == "False" and not w.status.placements
    cluster.model("chat", BORROWER)  # one that may sleep takes the node
    chat = work(cluster.run(signals({"chat": 0})), "chat")
    assert [p.node for p in chat.status.placements] == ["n1"]


def test_a_waker_asks_an_idle_borrower_to_yield_and_takes_the_node_it_gave() -> None:
    cluster = asleep()
    cluster.model("chat", BORROWER)
    cluster.run(signals({"chat": 5}))  # chat borrows n1
    plan = cluster.run(signals({"chat": 5}, held={"q": 1}))
    assert work(plan, "q").status.idle.state == "Waking"  # type: ignore[union-attr]
    assert condition(work(plan, "q"), "Awake")[1] == Reason.WAITING_FOR_NODE.value
    assert plan.idle.closes == ()  # chat served 5 s ago: within the grace, not asked
    plan = cluster.run(signals({"chat": 600}, held={"q": 1}))
    ask = CloseAsk("ai", "chat", "chat-0", "yield", 30, for_="ai/q", ip="10.0.0.9",
                   node="n1")
    assert plan.idle.closes == (ask,)
    plan = cluster.run(signals({"chat": 600}, held={"q": 1}, closes=(closed(ask),)))
    chat = work(plan, "chat")
    assert [c.target.kind for c in chat.changes.changes if isinstance(c, Delete)] == ["Pod"]
    assert chat.status.idle is not None and chat.status.idle.yields == 1
    q = work(plan, "q").status.idle
    assert q is not None and q.wake is not None and (q.wake.node, q.wake.reserved) == ("n1", True)
    q_work = work(cluster.run(signals(held={"q": 1})), "q")  # chat's pod gone: q takes n1
    assert [p.node for p in q_work.status.placements] == ["n1"]


def test_replicas_zero_is_off_with_no_idle_state() -> None:
    assert policy_of(MakeLocalModel("q").spec(**{**SLEEPER, "replicas": 0}).obj()) is None
    cluster = Cluster()
    cluster.model("q", {**SLEEPER, "replicas": 0})
    w = work(cluster.run(signals({"q": 4000})), "q")
    assert w.status.idle is None and not any(c.type == "Awake" for c in w.status.conditions)


def test_without_idle_signals_nothing_changes_for_an_idle_model() -> None:
    cluster = Cluster()
    cluster.model("q", SLEEPER)
    plan = cluster.run(None)
    assert plan.idle.closes == () and work(plan, "q").status.idle is None


def test_a_home_is_the_one_node_a_replicas_claim_is_pinned_to() -> None:
    """A local volume (hostname In [node]) makes a home; a network volume (no
    affinity), one several nodes reach, or one whose node is gone makes none."""
    cluster = Cluster(nodes=("n1", "n2", "n3", "n4"))
    for name in ("n1", "n2"):
        cluster.store["nodes"][name]["metadata"]["labels"]["zone"] = "z"
    cluster.model("q", {**SLEEPER, "replicas": 4})
    cluster.run(signals(busy=("q",)))
    terms = {
        "q-weights-0": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                               "operator": "In", "values": ["n2"]}]}],
        "q-weights-1": None,
        "q-weights-2": [{"matchExpressions": [{"key": "zone", "operator": "In",
                                               "values": ["z"]}]}],
        "q-weights-3": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": ["gone"]}]}],
    }
    for claim, term in terms.items():
        pv = f"pv-{claim}"
        cluster.store["claims"][claim]["spec"]["volumeName"] = pv
        spec = {} if term is None else {"nodeAffinity": {"required": {"nodeSelectorTerms": term}}}
        cluster.store["volumes"][pv] = {"metadata": {"name": pv, "uid": pv,
                                                     "resourceVersion": "1"}, "spec": spec}
    obs = observe(cluster.snapshot())
    lm = obs.models["ai/q"].model
    assert lm is not None
    assert [(h.replica, h.node, h.claim) for h in homes(obs, lm, "uid-q")] == [
        (0, "n2", "q-weights-0")]
