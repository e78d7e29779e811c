"""A replica's preferred node (`ModelDemand.prefer`: a sleeper's home, a node
yielded to it) and the yield's one-node question (`fits_after_removal`).

The preference is a tier of placing: after the PreferNoSchedule tier, before
best fit; it never moves a kept replica. The property tests hold it against the
brute-force reference in test_planner.py (which knows the tier) and against
a long-lived `Planner` (test_incremental_plan.py draws random preferences).
`fits_after_removal` is held against plain arithmetic over the plan."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.facts import NodeFacts
from localmodel.planner import (
    CpuRequest,
    ModelDemand,
    Usage,
    fits_after_removal,
    plan,
    rejection_after_removal,
    tolerates,
)
from tests.planner.test_planner import (
    PREFER_NOT,
    PROPERTY,
    G,
    Problem,
    demand,
    node,
    problems,
    where,
)

pytestmark = pytest.mark.unit


def prefers(d: ModelDemand, *nodes: str | None) -> ModelDemand:
    return dataclasses.replace(d, prefer=nodes)


# ------------------------------------------------------------------- prefer


def test_a_preferred_node_that_fits_wins_over_best_fit_and_the_reason_says_so() -> None:
    nodes = [node("small", cpus=4), node("big", cpus=16)]
    assert where(plan([demand("ai/a", cpu=2)], nodes)) == {("ai/a", 0): "small"}
    p = plan([prefers(demand("ai/a", cpu=2), "big")], nodes)
    assert where(p) == {("ai/a", 0): "big"}
    assert "prefers" in p.placements[0].reason


def test_a_preferred_node_that_does_not_fit_is_passed_over_for_best_fit() -> None:
    nodes = [node("small", cpus=4), node("big", cpus=16, mem_gib=2)]
    p = plan([prefers(demand("ai/a", cpu=2, mem_gib=4), "big")], nodes)
    assert where(p) == {("ai/a", 0): "small"}
    assert p.placements[0].reason.startswith("chosen: best fit")
    # Taken by an exclusive model placed first: the same.
    taken = plan([demand("ai/0", cpu=8, mem_gib=1), prefers(demand("ai/a", cpu=2), "big")],
                 [node("small", cpus=4), node("big", cpus=16)])
    assert where(taken) == {("ai/0", 0): "big", ("ai/a", 0): "small"}


def test_prefer_no_schedule_comes_before_the_preference() -> None:
    nodes = [node("tainted", cpus=16, taints=[PREFER_NOT]), node("plain", cpus=4)]
    assert where(plan([prefers(demand("ai/a", cpu=2), "tainted")], nodes)) == {
        ("ai/a", 0): "plain"
    }
    # When only tainted nodes fit, the preferred one among them wins.
    tainted = [node("t1", cpus=4, taints=[PREFER_NOT]), node("t2", cpus=16, taints=[PREFER_NOT]),
               node("plain", cpus=1)]
    assert where(plan([prefers(demand("ai/a", cpu=2), "t2")], tainted)) == {("ai/a", 0): "t2"}


def test_a_kept_replica_never_moves_to_its_preferred_node() -> None:
    nodes = [node("small", cpus=4), node("big", cpus=16)]
    p = plan([prefers(demand("ai/a", cpu=2), "big")], nodes, current={"ai/a": ["small"]})
    assert where(p) == {("ai/a", 0): "small"}
    assert p.placements[0].reason.startswith("kept:")


def test_the_preference_is_per_replica_and_an_unknown_node_is_ignored() -> None:
    nodes = [node("n1", cpus=4), node("n2", cpus=8), node("n3", cpus=16)]
    p = plan([prefers(demand("ai/a", cpu=2, replicas=3), "gone", "n3")], nodes)
    # replica 0: "gone" is no node (best fit n1); 1: n3; 2: no preference (n2 is left)
    assert where(p) == {("ai/a", 0): "n1", ("ai/a", 1): "n3", ("ai/a", 2): "n2"}


def test_a_demand_without_preferences_plans_as_before() -> None:
    d = demand("ai/a", cpu=2)
    assert d.prefer == () and d.preferred(0) is None
    assert d != prefers(d, "n1")  # a new preference is a new demand (the memo re-plans)


def test_the_preferred_node_is_never_over_committed_or_shared_with_an_exclusive_model() -> None:
    nodes = [node("home", cpus=4), node("other", cpus=4)]
    shared = demand("ai/s", cpu=2, exclusive=False)
    p = plan([shared, prefers(demand("ai/x", cpu=2), "home")], nodes, current={"ai/s": ["home"]})
    assert where(p) == {("ai/s", 0): "home", ("ai/x", 0): "other"}


# ------------------------------------------------------- fits_after_removal


def test_a_waker_fits_on_a_node_only_once_its_exclusive_holder_is_removed() -> None:
    n = node("n1", cpus=8, mem_gib=16)
    holder, waker = demand("ai/v", cpu=4), demand("ai/w", cpu=6)
    p = plan([holder], [n])
    demands = {holder.key: holder}
    assert rejection_after_removal(waker, n, p, demands, removed="ai/nobody") == (
        "holds exclusive model ai/v")
    assert fits_after_removal(waker, n, p, demands, removed="ai/v")


def test_the_others_on_the_node_and_other_pods_still_count_after_a_removal() -> None:
    n = node("n1", cpus=8, mem_gib=16)
    a, b = demand("ai/a", cpu=2, exclusive=False), demand("ai/b", cpu=4, exclusive=False)
    p = plan([a, b], [n])
    demands = {a.key: a, b.key: b}
    # b (4 CPUs) leaves; a keeps its 2: 6 free, 5 after other pods' 1000m.
    assert fits_after_removal(demand("ai/w", cpu=6, exclusive=False), n, p, demands, "ai/b")
    why = rejection_after_removal(demand("ai/w", cpu=6, exclusive=False), n, p, demands, "ai/b",
                                  Usage(cpu_milli=1000))
    assert why == "too few free CPUs (need 6, free 5)"
    assert rejection_after_removal(demand("ai/w", cpu=2), n, p, demands, "ai/b") == (
        "runs ai/a; this model is exclusive")
    big = demand("ai/w", cpu=1, mem_gib=20, exclusive=False)
    assert rejection_after_removal(big, n, p, demands, "ai/b") == (
        "too little free memory (need 20.0 GiB, free 12.0 GiB)")


def test_a_cpu_node_occupant_keeps_the_cpus_the_plan_gave_it() -> None:
    n = node("n1", cpus=8)
    a = demand("ai/a", cpu=2, exclusive=False)
    whole = demand("ai/z", cpu=None, exclusive=False)  # took the 6 left
    p = plan([a, whole], [n])
    demands = {a.key: a, whole.key: whole}
    assert not fits_after_removal(demand("ai/w", cpu=1, exclusive=False), n, p, demands, "ai/x")
    assert fits_after_removal(demand("ai/w", cpu=6, exclusive=False), n, p, demands, "ai/z")
    # a leaves its 2; z keeps its 6 (not every free CPU, as a second plan would give it)
    assert fits_after_removal(demand("ai/w", cpu=2, exclusive=False), n, p, demands, "ai/a")
    assert not fits_after_removal(demand("ai/w", cpu=3, exclusive=False), n, p, demands, "ai/a")


def test_an_occupant_without_a_demand_counts_as_exclusive() -> None:
    n = node("n1", cpus=8)
    a = demand("ai/a", cpu=2, exclusive=False)
    p = plan([a], [n])
    assert rejection_after_removal(demand("ai/w", cpu=1, exclusive=False), n, p, {}, "ai/x") == (
        "holds exclusive model ai/a")


def test_static_rejections_and_avoided_nodes_hold_after_a_removal() -> None:
    n = node("n1", cpus=8, labels={"pool": "a"})
    p = plan([], [n])
    assert "nodeSelector" in (rejection_after_removal(
        demand("ai/w", selector={"pool": "b"}), n, p, {}, "ai/x") or "")
    avoiding = dataclasses.replace(demand("ai/w"), avoid=frozenset({"n1"}))
    assert not fits_after_removal(avoiding, n, p, {}, "ai/x")
    cordoned = dataclasses.replace(n, schedulable=False)
    assert not fits_after_removal(demand("ai/w"), cordoned, p, {}, "ai/x")


def _fits_by_arithmetic(
    w: ModelDemand, n: NodeFacts, used: Usage, p_on: list[tuple[ModelDemand, int]]
) -> bool:
    """The documented rules by hand: the others' CPUs (as the plan gave them)
    and memory, exclusivity, the model's own replica, avoided nodes, labels."""
    cpu = n.allocatable_cpu_milli - used.cpu_milli
    mem = n.allocatable_memory_bytes - used.memory_bytes
    for d, reserved in p_on:
        cpu -= reserved * 1000 + d.overhead_cpu_milli
        mem -= d.memory_bytes
    others = [d for d, _ in p_on]
    hard = [t for t in n.taints if t.effect != "PreferNoSchedule"]
    tolerated = all(any(tolerates(tol, t) for tol in w.tolerations) for t in hard)
    return (
        n.schedulable
        and all(n.labels.get(k) == v for k, v in w.node_selector.items())
        and tolerated
        and w.key not in {d.key for d in others}
        and n.name not in w.avoid
        and not any(d.exclusive for d in others)
        and not (w.exclusive and others)
        and (cpu - w.overhead_cpu_milli) // 1000 >= w.cpu.least
        and mem >= w.memory_bytes
    )


@PROPERTY
@given(problems(), st.data())
def test_fits_after_removal_agrees_with_the_rules_by_hand(
    problem: Problem, data: st.DataObject
) -> None:
    models, nodes, current, usage = problem
    if not nodes:
        return
    p = plan(models, nodes, current, usage)
    demands = {m.key: m for m in models}
    n = data.draw(st.sampled_from(nodes))
    here = p.on_node(n.name)
    removed = data.draw(st.sampled_from([a.model for a in here] + ["ns/none"]))
    w = data.draw(st.sampled_from([*models, ModelDemand("ns/new", 1, CpuRequest(2), 2 * G)]))
    others = [(demands[a.model], a.cpu.reserved) for a in here if a.model != removed]
    used = usage.get(n.name, Usage())
    assert fits_after_removal(w, n, p, demands, removed, used) == (
        _fits_by_arithmetic(w, n, used, others)
    )
