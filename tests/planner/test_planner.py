"""The placement planner: table tests per rule, then properties (hypothesis),
including agreement with a brute-force reference planner written here from the
documented rules, so that the index can never silently miss or mis-rank a node."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localmodel.api import Toleration
from localmodel.facts import NodeFacts, Taint
from localmodel.planner import (
    Assignment,
    CpuRequest,
    Cpus,
    ModelDemand,
    Plan,
    PlannerSettings,
    Unplaced,
    Usage,
    plan,
    tolerates,
)
from localmodel.planner.fit import SortedEntries, first_fit, largest_fit
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

G = 1 << 30


def tol(
    key: str | None, operator: str = "Equal", value: str | None = None, effect: str | None = None
) -> Toleration:
    """An API toleration (validated there, once), in Kubernetes' field order."""
    fields = {"key": key, "operator": operator, "value": value, "effect": effect}
    return Toleration.model_validate({k: v for k, v in fields.items() if v is not None})


def node(
    name: str,
    cpus: float = 8,
    mem_gib: float = 32,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Taint] = (),
    schedulable: bool = True,
) -> NodeFacts:
    """The tables' positional shorthand for `MakeNode(name).cpus(..).memory_gib(..)...`."""
    made = MakeNode(name).cpus(cpus).memory_gib(mem_gib).labels(labels).taints(*taints)
    return made.unschedulable(not schedulable).facts()


def demand(
    key: str,
    cpu: int | None = 2,
    mem_gib: float = 4,
    replicas: int = 1,
    exclusive: bool = True,
    selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Toleration] = (),
    overhead: int = 0,
) -> ModelDemand:
    return ModelDemand(
        key=key,
        replicas=replicas,
        cpu=CpuRequest(cpu),
        memory_bytes=int(mem_gib * G),
        exclusive=exclusive,
        node_selector=dict(selector or {}),
        tolerations=tuple(tolerations),
        overhead_cpu_milli=overhead,
    )


def where(p: Plan) -> dict[tuple[str, int], str]:
    return {(x.model, x.replica): x.node for x in p.placements}


def only_unplaced(p: Plan) -> Unplaced:
    assert len(p.unplaced) == 1, p.unplaced
    return p.unplaced[0]


# ----------------------------------------------------------------- exclusivity


def test_exclusive_models_get_separate_nodes() -> None:
    p = plan([demand("ai/a"), demand("ai/b")], [node("n1"), node("n2")])
    assert sorted(where(p).values()) == ["n1", "n2"]


def test_exclusive_model_is_unplaced_when_its_only_node_is_taken() -> None:
    p = plan([demand("ai/a"), demand("ai/b")], [node("n1")])
    assert where(p) == {("ai/a", 0): "n1"}
    u = only_unplaced(p)
    assert (u.model, u.reason) == ("ai/b", "NoFeasibleNode")
    assert u.rejections == {"n1": "holds exclusive model ai/a"}


def test_non_exclusive_models_share_a_node() -> None:
    shared = [demand("ai/a", exclusive=False), demand("ai/b", exclusive=False)]
    p = plan(shared, [node("n1", cpus=8)])
    assert where(p) == {("ai/a", 0): "n1", ("ai/b", 0): "n1"}


def test_exclusive_model_never_joins_a_shared_node() -> None:
    p = plan([demand("ai/a", exclusive=False), demand("ai/b")], [node("n1", cpus=32)])
    assert where(p) == {("ai/a", 0): "n1"}
    assert "this model is exclusive" in only_unplaced(p).rejections["n1"]


def test_non_exclusive_model_never_joins_an_exclusive_one() -> None:
    p = plan([demand("ai/a"), demand("ai/b", exclusive=False)], [node("n1", cpus=32)])
    assert where(p) == {("ai/a", 0): "n1"}
    assert only_unplaced(p).rejections == {"n1": "holds exclusive model ai/a"}


def test_replicas_land_on_distinct_nodes_and_the_extra_one_is_unplaced() -> None:
    p = plan([demand("ai/a", replicas=3, exclusive=False)], [node("n1", cpus=64), node("n2")])
    assert sorted(where(p).values()) == ["n1", "n2"]
    u = only_unplaced(p)
    assert u.replica == 2
    assert set(u.rejections.values()) == {
        "already runs replica 0 of this model",
        "already runs replica 1 of this model",
    }


# ------------------------------------------------------------------ resources


def test_best_fit_picks_the_node_with_fewest_cpus_left_over() -> None:
    nodes = [node("big", cpus=32), node("small", cpus=4), node("mid", cpus=8)]
    p = plan([demand("ai/a", cpu=4)], nodes)
    assert where(p) == {("ai/a", 0): "small"}
    assert p.placements[0].reason.startswith("chosen: best fit")


def test_best_fit_ties_break_on_least_free_memory_then_name() -> None:
    nodes = [node("b", mem_gib=16), node("a", mem_gib=16), node("c", mem_gib=8)]
    assert where(plan([demand("ai/x", mem_gib=4)], nodes)) == {("ai/x", 0): "c"}
    nodes = [node("b", mem_gib=16), node("a", mem_gib=16)]
    assert where(plan([demand("ai/x", mem_gib=4)], nodes)) == {("ai/x", 0): "a"}


def test_cpu_node_takes_every_free_whole_cpu_of_the_largest_node() -> None:
    nodes = [node("n1", cpus=8), node("n2", cpus=16.9)]
    p = plan([demand("ai/a", cpu=None)], nodes, usage={"n2": Usage(cpu_milli=500)})
    assert p.placements == (Assignment("ai/a", 0, "n2", Cpus(16, 16), 4 * G),)


def test_cpu_node_gets_what_fixed_demands_leave_whatever_the_keys() -> None:
    # "a" sorts first, but a cpu: node demand is placed after fixed ones.
    models = [demand("ai/a", cpu=None, exclusive=False), demand("ai/b", cpu=3, exclusive=False)]
    p = plan(models, [node("n1", cpus=8)])
    assert {x.model: x.cpu.count for x in p.placements} == {"ai/a": 5, "ai/b": 3}
    assert plan(models, [node("n1", cpus=8)], current=p.as_current()) == p


def test_cpu_node_with_a_narrow_selector_also_takes_the_largest_node() -> None:
    # Few matching nodes: searched one by one rather than through the index.
    nodes = [node(f"n{c}", cpus=c, labels={"pool": "p"}) for c in (4, 16, 8)] + [node("x", cpus=64)]
    p = plan([demand("ai/a", cpu=None, selector={"pool": "p"})], nodes)
    assert p.placements == (Assignment("ai/a", 0, "n16", Cpus(16, 16), 4 * G),)


def test_cpu_node_needs_at_least_one_whole_cpu() -> None:
    p = plan([demand("ai/a", cpu=None)], [node("n1", cpus=0.9)])
    assert only_unplaced(p).rejections == {"n1": "too few free CPUs (need 1, free 0)"}


def test_node_without_enough_memory_is_skipped() -> None:
    p = plan([demand("ai/a", mem_gib=20)], [node("small", mem_gib=16), node("big", mem_gib=64)])
    assert where(p) == {("ai/a", 0): "big"}


def test_memory_shortfall_is_explained_with_numbers() -> None:
    p = plan([demand("ai/a", mem_gib=5.2)], [node("n1", mem_gib=3.1)])
    u = only_unplaced(p)
    assert u.rejections == {"n1": "too little free memory (need 5.2 GiB, free 3.1 GiB)"}
    assert u.message == "no node for replica 0 (2 CPUs, 5.2 GiB): n1: " + u.rejections["n1"]


def test_other_pods_usage_is_subtracted() -> None:
    nodes = [node("n1", cpus=8, mem_gib=16), node("n2", cpus=8, mem_gib=16)]
    usage = {"n1": Usage(cpu_milli=7000, memory_bytes=0), "n2": Usage(0, 14 * G)}
    p = plan([demand("ai/a", cpu=2, mem_gib=4)], nodes, usage=usage)
    u = only_unplaced(p)
    assert u.rejections == {
        "n1": "too few free CPUs (need 2, free 1)",
        "n2": "too little free memory (need 4.0 GiB, free 2.0 GiB)",
    }


def test_usage_for_an_unknown_node_is_ignored() -> None:
    p = plan([demand("ai/a")], [node("n1")], usage={"elsewhere": Usage(10**9, 10**15)})
    assert where(p) == {("ai/a", 0): "n1"}


def test_sidecar_overhead_must_fit_too_but_is_not_in_the_cpu_count() -> None:
    exact = [node("n1", cpus=4)]
    assert plan([demand("ai/a", cpu=4)], exact).placements[0].cpu == Cpus(4, 4)
    u = only_unplaced(plan([demand("ai/a", cpu=4, overhead=100)], exact))
    assert "need 4 whole after 100m for sidecars" in u.rejections["n1"]
    p = plan([demand("ai/a", cpu=None, overhead=100)], [node("n1", cpus=8)])
    assert p.placements[0].cpu == Cpus(7, 7)  # 8000m - 100m leaves 7 whole CPUs


def test_shared_node_is_never_over_committed() -> None:
    models = [demand(f"ai/m{i}", cpu=3, exclusive=False) for i in range(3)]
    p = plan(models, [node("n1", cpus=8)])
    assert len(p.placements) == 2
    assert "too few free CPUs (need 3, free 2)" in only_unplaced(p).message


# ------------------------------------------------------ selectors and taints


def test_node_selector_must_match_every_label() -> None:
    nodes = [
        node("a", labels={"pool": "cpu", "zone": "z1"}),
        node("b", labels={"pool": "cpu", "zone": "z2"}),
        node("c", labels={"zone": "z1"}),
    ]
    p = plan([demand("ai/x", selector={"pool": "cpu", "zone": "z2"})], nodes)
    assert where(p) == {("ai/x", 0): "b"}
    p = plan([demand("ai/x", selector={"pool": "gpu"})], nodes)
    u = only_unplaced(p)
    assert u.reason == "NoMatchingNode"
    assert u.rejections["a"] == "label pool=cpu does not match nodeSelector pool=gpu"
    assert u.rejections["c"] == "label pool missing (nodeSelector wants pool=gpu)"


NO_SCHEDULE = Taint("dedicated", "ml", "NoSchedule")
NO_EXECUTE = Taint("maintenance", "", "NoExecute")
PREFER_NOT = Taint("spot", "true", "PreferNoSchedule")


@pytest.mark.parametrize("taint", [NO_SCHEDULE, NO_EXECUTE], ids=lambda t: t.effect)
def test_hard_taints_reject_a_node(taint: Taint) -> None:
    p = plan([demand("ai/a")], [node("n1", taints=[taint])])
    u = only_unplaced(p)
    assert u.reason == "NoMatchingNode"
    assert u.rejections["n1"].startswith("taint ") and taint.effect in u.rejections["n1"]


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (tol("dedicated", "Equal", "ml"), NO_SCHEDULE, True),
        (tol("dedicated", "Equal", "web"), NO_SCHEDULE, False),
        (tol("dedicated", "Exists"), NO_SCHEDULE, True),
        (tol("other", "Exists"), NO_SCHEDULE, False),
        (tol(None, "Exists"), NO_SCHEDULE, True),
        (tol("", "Exists"), NO_EXECUTE, True),
        (tol("dedicated", "Exists", effect="NoSchedule"), NO_SCHEDULE, True),
        (tol("dedicated", "Exists", effect="NoExecute"), NO_SCHEDULE, False),
        (tol("maintenance", "Equal", "", "NoExecute"), NO_EXECUTE, True),
        (tol(None, "Exists", effect="NoSchedule"), NO_EXECUTE, False),
    ],
)
def test_toleration_matching_follows_kubernetes(
    toleration: Toleration, taint: Taint, tolerated: bool
) -> None:
    assert tolerates(toleration, taint) is tolerated
    p = plan([demand("ai/a", tolerations=[toleration])], [node("n1", taints=[taint])])
    assert bool(p.placements) is tolerated


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": None},  # empty key needs Exists
        {"key": "", "operator": "Equal", "value": "x"},
        {"key": "k", "operator": "Exists", "value": "x"},
        {"key": "k", "operator": "Maybe"},
    ],
)
def test_invalid_tolerations_are_refused(kwargs: dict[str, object]) -> None:
    """The planner matches only API tolerations, which validate themselves."""
    with pytest.raises(ValueError):
        Toleration.model_validate(kwargs)


def test_prefer_no_schedule_is_avoided_but_not_a_rejection() -> None:
    # The tainted node is the better fit, yet the untainted one wins.
    nodes = [node("tainted", cpus=4, taints=[PREFER_NOT]), node("plain", cpus=16)]
    assert where(plan([demand("ai/a", cpu=4)], nodes)) == {("ai/a", 0): "plain"}
    # Alone, the tainted node is used, and the reason says so.
    p = plan([demand("ai/a", cpu=4)], nodes[:1])
    assert where(p) == {("ai/a", 0): "tainted"}
    assert "PreferNoSchedule" in p.placements[0].reason
    # Tolerating it removes the penalty: best fit again.
    tolerant = demand("ai/a", cpu=4, tolerations=[tol("spot", "Exists")])
    assert where(plan([tolerant], nodes)) == {("ai/a", 0): "tainted"}


def test_unschedulable_nodes_are_rejected() -> None:
    p = plan([demand("ai/a")], [node("n1", schedulable=False)])
    u = only_unplaced(p)
    assert (u.reason, u.rejections) == ("NoMatchingNode", {"n1": "unschedulable (cordoned)"})


def test_no_nodes_at_all() -> None:
    u = only_unplaced(plan([demand("ai/a")], []))
    assert u.reason == "NoNodes" and "there are no nodes" in u.message


# ------------------------------------------------------------------ stability


def test_existing_placement_stays_even_when_a_better_fit_exists() -> None:
    nodes = [node("big", cpus=32), node("small", cpus=4)]
    p = plan([demand("ai/a", cpu=4)], nodes, current={"ai/a": ["big"]})
    assert where(p) == {("ai/a", 0): "big"}
    assert p.placements[0].reason == "kept: already on big and still fits"


def test_placement_on_a_removed_node_is_re_planned() -> None:
    p = plan([demand("ai/a")], [node("n2")], current={"ai/a": ["n1"]})
    assert where(p) == {("ai/a", 0): "n2"}
    assert p.placements[0].reason.startswith("was on n1: node is gone; chosen")


def test_placement_that_no_longer_fits_moves() -> None:
    nodes = [node("n1", cpus=8), node("n2", cpus=8)]
    p = plan([demand("ai/a", cpu=4)], nodes, {"ai/a": ["n1"]}, {"n1": Usage(6000, 0)})
    assert where(p) == {("ai/a", 0): "n2"}
    assert "was on n1: too few free CPUs (need 4, free 2)" in p.placements[0].reason


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"schedulable": False}, "unschedulable"),
        ({"taints": [NO_EXECUTE]}, "not tolerated"),
        ({"labels": {"pool": "other"}}, "does not match nodeSelector"),
    ],
)
def test_placement_on_a_node_no_longer_eligible_moves(change: dict[str, object], why: str) -> None:
    m = demand("ai/a", selector={"pool": "cpu"})
    base: dict[str, object] = {"labels": {"pool": "cpu"}}
    n1 = node("n1", **{**base, **change})  # type: ignore[arg-type]
    p = plan([m], [n1, node("n2", labels={"pool": "cpu"})], current={"ai/a": ["n1"]})
    assert where(p) == {("ai/a", 0): "n2"}
    assert why in p.placements[0].reason


def test_adding_a_model_does_not_move_existing_ones() -> None:
    nodes = [node("n4", cpus=4), node("n8", cpus=8), node("n16", cpus=16)]
    first = plan([demand("ai/b", cpu=4)], nodes)
    assert where(first) == {("ai/b", 0): "n4"}
    # "ai/a" sorts first and would fit n4 best, but n4 is taken and stays so.
    second = plan([demand("ai/b", cpu=4), demand("ai/a", cpu=2)], nodes, first.as_current())
    assert where(second) == {("ai/b", 0): "n4", ("ai/a", 0): "n8"}


def test_conflicting_current_placements_keep_the_first_by_key() -> None:
    current = {"ai/a": ["n1"], "ai/b": ["n1"]}
    p = plan([demand("ai/b"), demand("ai/a")], [node("n1"), node("n2")], current)
    assert where(p) == {("ai/a", 0): "n1", ("ai/b", 0): "n2"}


def test_a_replica_listed_twice_in_current_is_re_planned() -> None:
    p = plan([demand("ai/a", replicas=2)], [node("n1"), node("n2")], {"ai/a": ["n1", "n1"]})
    assert where(p) == {("ai/a", 0): "n1", ("ai/a", 1): "n2"}


def test_scaling_down_drops_the_extra_current_entries() -> None:
    p = plan([demand("ai/a", replicas=1)], [node("n1"), node("n2")], {"ai/a": ["n2", "n1"]})
    assert where(p) == {("ai/a", 0): "n2"}


# ------------------------------------------------------------- explanations


def test_message_lists_every_node_in_a_small_cluster() -> None:
    nodes = [
        node("a", mem_gib=2),
        node("b", schedulable=False),
        node("c", taints=[NO_SCHEDULE]),
        node("d", cpus=1),
    ]
    u = only_unplaced(plan([demand("ai/x", mem_gib=4)], nodes))
    assert u.message == (
        "no node for replica 0 (2 CPUs, 4.0 GiB): "
        "a: too little free memory (need 4.0 GiB, free 2.0 GiB); "
        "b: unschedulable (cordoned); "
        "c: taint dedicated=ml:NoSchedule not tolerated; "
        "d: too few free CPUs (need 2, free 1)"
    )
    assert u.reason == "NoFeasibleNode"


def test_message_summarises_a_large_cluster_and_rejections_stay_bounded() -> None:
    nodes = [node(f"n{i:03}", cpus=8, mem_gib=3) for i in range(90)] + [
        node(f"x{i:03}", cpus=8, mem_gib=64) for i in range(10)
    ]
    models = [demand(f"ai/m{i:02}", mem_gib=5) for i in range(11)]
    p = plan(models, nodes)
    u = only_unplaced(p)
    assert u.model == "ai/m10"
    assert u.message == (
        "no node for replica 0 (2 CPUs, 5.0 GiB): 100 nodes rejected: "
        "90 with too little free memory (need 5.0 GiB, most free 3.0 GiB), "
        "10 already holding an exclusive model"
    )
    assert 0 < len(u.rejections) <= 2 * PlannerSettings().examples_per_category
    assert u.rejections["x000"].startswith("holds exclusive model ai/m")


def test_large_cluster_summary_counts_a_models_own_nodes_once() -> None:
    nodes = [node(f"n{i:03}", cpus=8) for i in range(60)]
    p = plan([demand("ai/a", replicas=61)], nodes)
    u = only_unplaced(p)
    assert u.replica == 60
    assert u.message.endswith("60 nodes rejected: 60 already running a replica of this model")


def test_demand_validation() -> None:
    for bad in ({"replicas": -1}, {"memory_bytes": -1}, {"overhead_cpu_milli": -1}):
        args: dict[str, object] = {
            "key": "ai/a", "replicas": 1, "cpu": CpuRequest(1), "memory_bytes": 0
        }
        with pytest.raises(ValueError):
            ModelDemand(**{**args, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cpu must be a positive integer or 'node'"):
        CpuRequest(0)


def test_duplicate_models_or_nodes_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        plan([demand("ai/a"), demand("ai/a")], [node("n1")])
    with pytest.raises(ValueError, match="twice"):
        plan([demand("ai/a")], [node("n1"), node("n1")])


def test_plan_lookups() -> None:
    p = plan([demand("ai/a", replicas=2), demand("ai/b")], [node("n1"), node("n2")])
    assert [x.replica for x in p.placements_for("ai/a")] == [0, 1]
    assert p.unplaced_for("ai/b")[0].replica == 0
    assert p.node_of("ai/a", 1) == "n2" and p.node_of("ai/b", 0) is None
    assert p.on_node("n1") == p.placements_for("ai/a")[:1]
    assert p.as_current() == {"ai/a": ("n1", "n2"), "ai/b": (None,)}


def test_reasons_are_not_part_of_plan_equality() -> None:
    a = Assignment("ai/a", 0, "n1", Cpus(2, 2), G, reason="chosen: ...")
    assert a == Assignment("ai/a", 0, "n1", Cpus(2, 2), G, reason="kept: ...")


# ----------------------------------------------------------- the sorted index


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=120))
def test_chunked_sorted_list_matches_a_plain_sorted_list(ops: list[tuple[bool, int]]) -> None:
    s = SortedEntries(chunk_size=2)
    plain: list[tuple[int, int, str]] = []
    for add, v in ops:
        entry = (v % 5, v, f"n{v}")
        if add and entry not in plain:
            s.add(entry)
            plain.append(entry)
        elif not add and entry in plain:
            s.remove(entry)
            plain.remove(entry)
        plain.sort()
        assert len(s) == len(plain)
        assert [s[i] for i in range(len(s))] == plain
        key = (v % 5, 7, "")
        expected = sum(1 for e in plain if e < key)
        assert s.bisect_left(key) == expected
        assert s.bisect_left(key, 1, 2) == min(max(expected, 1), 2)
        # The searches, against their definitions over the plain list.
        cpu, memory = v % 4 + 1, v % 7 * 4
        usable = [e for e in plain if e[1] >= memory and int(e[2][1:]) % 3 != 0]
        accept = lambda name: int(name[1:]) % 3 != 0  # noqa: E731
        fit = next((e for e in usable if e[0] >= cpu), None)
        assert first_fit(s, cpu, memory, accept) == fit
        largest = min(
            (e for e in usable if e[0] >= 1), key=lambda e: (-e[0], e[1], e[2]), default=None
        )
        assert largest_fit(s, memory, accept) == largest


# ---------------------------------------------------------------- properties

TAINTS = [NO_SCHEDULE, NO_EXECUTE, PREFER_NOT, Taint("dedicated", "web", "NoSchedule")]
TOLERATIONS: list[tuple[Toleration, ...]] = [
    (),
    (),
    (tol("dedicated", "Equal", "ml"),),
    (tol("dedicated", "Exists"),),
    (tol(None, "Exists"),),
    (tol("spot", "Exists", effect="PreferNoSchedule"),),
    (tol("maintenance", "Exists", effect="NoExecute"), tol("dedicated", "Exists")),
]
LABELS: list[dict[str, str]] = [{}, {"pool": "a"}, {"pool": "b"}, {"pool": "a", "zone": "z1"}]
SELECTORS: list[dict[str, str]] = [{}, {}, {"pool": "a"}, {"pool": "b"}, {"zone": "z1"}]


@st.composite
def problems(
    draw: st.DrawFn,
) -> tuple[list[ModelDemand], list[NodeFacts], dict[str, list[str | None]], dict[str, Usage]]:
    nodes = [
        NodeFacts(
            name=f"n{i}",
            allocatable_cpu_milli=draw(st.integers(0, 12)) * 1000 + draw(st.sampled_from([0, 500])),
            allocatable_memory_bytes=draw(st.integers(0, 24)) * G,
            labels=draw(st.sampled_from(LABELS)),
            taints=tuple(draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True))),
            schedulable=draw(st.sampled_from([True, True, True, False])),
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    names = [n.name for n in nodes]
    used = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    usage = {n: Usage(draw(st.integers(0, 3000)), draw(st.integers(0, 4)) * G) for n in used}
    models = [
        ModelDemand(
            key=f"ns/m{i}",
            replicas=draw(st.integers(0, 3)),
            cpu=CpuRequest(draw(st.none() | st.integers(1, 6))),
            memory_bytes=draw(st.integers(0, 12)) * G,
            exclusive=draw(st.booleans()),
            node_selector=draw(st.sampled_from(SELECTORS)),
            tolerations=draw(st.sampled_from(TOLERATIONS)),
            overhead_cpu_milli=draw(st.sampled_from([0, 0, 100, 1500])),
            prefer=tuple(draw(st.lists(st.sampled_from([None, "gone", *names]), max_size=3))),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    current = {
        m.key: draw(st.lists(st.sampled_from([None, "gone", *names]), max_size=4))
        for m in models
        if draw(st.booleans())
    }
    return models, nodes, current, usage


Problem = tuple[list[ModelDemand], list[NodeFacts], dict[str, list[str | None]], dict[str, Usage]]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# The planner's other code paths: views for every selector instead of direct
# search, tiny chunks, and counted (not per-node) explanations.
VARIANTS = {
    "default": PlannerSettings(),
    "other-paths": PlannerSettings(direct_search=0, chunk_size=1, max_rejections=0, list_nodes=0),
}
COUNTED = PlannerSettings(max_rejections=0, list_nodes=0)


def reference(
    models: Sequence[ModelDemand],
    nodes: Sequence[NodeFacts],
    current: Mapping[str, Sequence[str | None]],
    usage: Mapping[str, Usage],
) -> tuple[dict[tuple[str, int], tuple[str, int]], set[tuple[str, int]]]:
    """The documented rules, checked node by node: O(models x nodes). A
    replica placed afresh takes, among the nodes that fit, one with the fewest
    untolerated PreferNoSchedule taints, its preferred node among those, then
    best fit."""
    by_name = {n.name: n for n in nodes}
    cpu = {n.name: n.allocatable_cpu_milli - usage.get(n.name, Usage()).cpu_milli for n in nodes}
    mem = {
        n.name: n.allocatable_memory_bytes - usage.get(n.name, Usage()).memory_bytes for n in nodes
    }
    holders: dict[str, list[ModelDemand]] = {n.name: [] for n in nodes}

    def tolerated(t: Taint, d: ModelDemand) -> bool:
        for tol in d.tolerations:
            key_ok = not tol.key or tol.key == t.key
            effect_ok = tol.effect is None or tol.effect == t.effect
            value_ok = tol.operator == "Exists" or (tol.value or "") == t.value
            if key_ok and effect_ok and value_ok:
                return True
        return False

    def eligible(n: NodeFacts, d: ModelDemand) -> bool:
        return (
            n.schedulable
            and all(n.labels.get(k) == v for k, v in d.node_selector.items())
            and all(tolerated(t, d) for t in n.taints if t.effect != "PreferNoSchedule")
        )

    def fits(n: NodeFacts, d: ModelDemand) -> bool:
        here = holders[n.name]
        if d in here or any(h.exclusive for h in here) or (d.exclusive and here):
            return False
        return (cpu[n.name] - d.overhead_cpu_milli) // 1000 >= (d.cpu.count or 1) and mem[
            n.name
        ] >= d.memory_bytes

    placed: dict[tuple[str, int], tuple[str, int]] = {}

    def put(n: NodeFacts, d: ModelDemand, r: int) -> None:
        take = d.cpu.count or (cpu[n.name] - d.overhead_cpu_milli) // 1000
        cpu[n.name] -= take * 1000 + d.overhead_cpu_milli
        mem[n.name] -= d.memory_bytes
        holders[n.name].append(d)
        placed[(d.key, r)] = (n.name, take)

    order = sorted(models, key=lambda d: (d.cpu.count is None, d.key))
    pending = []
    for d in order:
        was = list(current.get(d.key, ()))
        for r in range(d.replicas):
            name = was[r] if r < len(was) else None
            n = by_name.get(name) if name else None
            if n is not None and eligible(n, d) and fits(n, d):
                put(n, d, r)
            else:
                pending.append((d, r))
    unplaced = set()
    for d, r in pending:
        fitting = [n for n in nodes if eligible(n, d) and fits(n, d)]
        if not fitting:
            unplaced.add((d.key, r))
            continue

        def score(
            n: NodeFacts, d: ModelDemand = d, r: int = r
        ) -> tuple[int, bool, int, int, str]:
            penalty = sum(
                1 for t in n.taints if t.effect == "PreferNoSchedule" and not tolerated(t, d)
            )
            other = n.name != (d.prefer[r] if r < len(d.prefer) else None)
            free = (cpu[n.name] - d.overhead_cpu_milli) // 1000
            return (penalty, other, free if d.cpu.count is not None else -free, mem[n.name],
                    n.name)

        put(min(fitting, key=score), d, r)
    return placed, unplaced


@pytest.mark.parametrize("variant", ["default", "other-paths"])
@PROPERTY
@given(problems())
def test_plan_matches_the_brute_force_reference(variant: str, problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage, settings=VARIANTS[variant])
    placed, unplaced = reference(models, nodes, current, usage)
    assert {(x.model, x.replica): (x.node, x.cpu.reserved) for x in p.placements} == placed
    assert {(u.model, u.replica) for u in p.unplaced} == unplaced


@PROPERTY
@given(problems())
def test_no_exclusive_model_ever_shares_a_node(problem: Problem) -> None:
    models, nodes, current, usage = problem
    exclusive = {m.key for m in models if m.exclusive}
    per_node: dict[str, list[str]] = {}
    for x in plan(models, nodes, current, usage).placements:
        per_node.setdefault(x.node, []).append(x.model)
    for here in per_node.values():
        if exclusive & set(here):
            assert len(here) == 1, here


@PROPERTY
@given(problems())
def test_cpu_and_memory_are_never_over_committed(problem: Problem) -> None:
    models, nodes, current, usage = problem
    demand = {m.key: m for m in models}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    for x in plan(models, nodes, current, usage).placements:
        assert x.cpu.reserved >= 1 and x.memory_bytes == demand[x.model].memory_bytes
        if demand[x.model].cpu.count is not None:
            assert x.cpu.reserved == demand[x.model].cpu.count
        cpu[x.node] += x.cpu.reserved * 1000 + demand[x.model].overhead_cpu_milli
        mem[x.node] += x.memory_bytes
    for n in nodes:
        used = usage.get(n.name, Usage())
        assert cpu[n.name] + used.cpu_milli <= n.allocatable_cpu_milli or not cpu[n.name]
        assert mem[n.name] + used.memory_bytes <= n.allocatable_memory_bytes or not mem[n.name]


@PROPERTY
@given(problems())
def test_replicas_of_a_model_are_on_distinct_nodes(problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage)
    for m in models:
        on = [x.node for x in p.placements_for(m.key)]
        assert len(on) == len(set(on))


@PROPERTY
@given(problems())
def test_every_replica_is_placed_or_unplaced_exactly_once(problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage)
    seen = [(x.model, x.replica) for x in p.placements] + [(u.model, u.replica) for u in p.unplaced]
    assert sorted(seen) == sorted((m.key, r) for m in models for r in range(m.replicas))
    # The per-model lookups (indexed once) agree with a scan of the plan.
    for m in models:
        assert p.placements_for(m.key) == tuple(x for x in p.placements if x.model == m.key)
        assert p.unplaced_for(m.key) == tuple(u for u in p.unplaced if u.model == m.key)
    assert p.placements_for("nobody/here") == () and p.unplaced_for("nobody/here") == ()


@pytest.mark.parametrize("variant", ["default", "other-paths"])
@PROPERTY
@given(problems())
def test_re_planning_a_plan_returns_it_unchanged(variant: str, problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage, settings=VARIANTS[variant])
    again = plan(models, nodes, p.as_current(), usage, settings=VARIANTS[variant])
    assert again == p  # decisions, and unplaced messages and rejections too
    assert all(x.reason.startswith("kept:") for x in again.placements)


@PROPERTY
@given(problems(), st.randoms(use_true_random=False))
def test_input_order_does_not_matter(problem: Problem, rnd: random.Random) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage)
    rnd.shuffle(models)
    rnd.shuffle(nodes)
    shuffled = plan(models, nodes, dict(reversed(current.items())), usage)
    assert repr(shuffled) == repr(p)  # reasons and messages included


@PROPERTY
@given(problems())
def test_a_new_model_never_moves_existing_placements(problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage)
    newcomer = ModelDemand(
        "aaa/new", replicas=2, cpu=CpuRequest(1), memory_bytes=G, exclusive=False
    )
    after = plan([*models, newcomer], nodes, p.as_current(), usage)
    assert set(p.placements) <= set(after.placements)


@PROPERTY
@given(problems())
def test_unplaced_replicas_are_explained_node_by_node(problem: Problem) -> None:
    models, nodes, current, usage = problem
    p = plan(models, nodes, current, usage)
    for u in p.unplaced:
        assert set(u.rejections) == {n.name for n in nodes}
        assert all(u.rejections.values())
        assert u.reason in ({"NoNodes"} if not nodes else {"NoMatchingNode", "NoFeasibleNode"})
        for name, why in u.rejections.items():
            assert f"{name}: {why}" in u.message


@PROPERTY
@given(problems())
def test_counted_explanations_agree_with_node_by_node_ones(problem: Problem) -> None:
    models, nodes, current, usage = problem
    direct = plan(models, nodes, current, usage)
    counted = plan(models, nodes, current, usage, settings=COUNTED)
    for d, c in zip(direct.unplaced, counted.unplaced, strict=True):
        assert d.reason == c.reason
        if not nodes:
            continue
        summary = c.message.split(" rejected: ", 1)[1]
        expected = Counter(_kind(why) for why in d.rejections.values())
        counted_kinds: dict[str, int] = {}
        for part in re.split(r", (?=\d+ )", summary):
            n, phrase = part.split(" ", 1)
            kinds = [k for k in expected if phrase.startswith(k)]
            assert len(kinds) == 1, (phrase, expected)
            counted_kinds[kinds[0]] = int(n)
        assert counted_kinds == expected
        cpu = [int(w.rsplit("free ", 1)[1][:-1]) for w in d.rejections.values() if "CPUs" in w]
        if cpu:
            assert f"most free {max(cpu)})" in summary
        memory = [_gib(w.rsplit("free ", 1)[1][:-1]) for w in d.rejections.values() if "mem" in w]
        if memory:
            most = summary.split("memory (need ", 1)[1].split("most free ", 1)[1].split(")")[0]
            assert _gib(most) == max(memory)
        # The sample names real rejections, with the same words.
        assert c.rejections
        for name, why in c.rejections.items():
            assert d.rejections[name] == why


def _gib(text: str) -> float:
    number, unit = text.split()
    return float(number) / (1024 if unit == "MiB" else 1)


def _kind(why: str) -> str:
    """The summary phrase's start for a per-node reason."""
    if why.startswith("unschedulable"):
        return "unschedulable"
    if why.startswith("label "):
        return "not matching nodeSelector"
    if why.startswith("taint "):
        return "with " + why.removesuffix(" not tolerated")
    if why.startswith("already runs replica"):
        return "already running a replica"
    if why.startswith("holds exclusive"):
        return "already holding an exclusive model"
    if why.startswith("runs "):
        return "running other models"
    if why.startswith("too few free CPUs"):
        return "with too few free CPUs"
    return "with too little free memory"


def test_avoided_nodes_are_rejected_kept_placements_move_and_the_reason_says_why() -> None:
    """A node where the scheduler left the model's pod Unschedulable is avoided:
    the replica moves to the next eligible node, in small clusters (direct search,
    listed rejections) and large ones (the index, counted rejections)."""
    for n_nodes in (3, 60):
        nodes = [node(f"n{i:02d}", cpus=4 + i) for i in range(n_nodes)]
        first = plan([demand("ai/m", cpu=4)], nodes)
        [a] = first.placements
        assert a.node == "n00"  # best fit: the smallest node that fits
        again = plan([ModelDemand("ai/m", 1, CpuRequest(4), G, avoid=frozenset({"n00"}))], nodes,
                     current=first.as_current())
        [b] = again.placements
        assert b.node == "n01"
        nowhere = plan([ModelDemand("ai/m", 1, CpuRequest(4), G,
                                    avoid=frozenset(n.name for n in nodes))], nodes)
        [u] = nowhere.unplaced
        assert "Unschedulable" in u.message, u.message
