"""doctor's `idle` check (pure): a model with spec.idle whose wake has waited
longer than its holdSeconds is named with every node and why it cannot take
it, in the planner's words and the idle rules'; the router off and a gateway
that could not be closed are warnings. The LocalModels are stored objects as
the operator writes them: the plain path's status with `idle_status.with_idle`
over it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from localmodel.api import IdleHome, IdleStatus, IdleWake, LocalModel
from localmodel.desired import desired_state
from localmodel.doctor.cluster import ClusterView, cluster_findings
from localmodel.doctor.report import Finding, Verdict
from localmodel.doctor.wake import idle_findings
from localmodel.facts import NodeFacts, Taint
from localmodel.idle_status import IdleReport, with_idle
from localmodel.status import Reason, status_body
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 1, 21, 10, tzinfo=UTC)
PLACED_AT = "2026-12-01T20:00:00Z"
WANTED = "2026-12-01T21:05:00Z"  # 5 min before NOW: past a 120 s hold
JUST_NOW = "2026-12-01T21:09:30Z"  # 30 s before NOW: within it

SMALL = MakeNode("small-0").cpus(6).memory_gib(16).cpu_flags({"AVX2"})
AVX2 = MakeNode("avx2-0").cpus(6).memory_gib(16).cpu_flags({"AVX2"})
BIG = MakeNode("big-0").cpus(16).memory_gib(3).cpu_flags({"AVX2"})
NODES = [SMALL, AVX2, BIG]


def facts(*made: MakeNode) -> dict[str, NodeFacts]:
    return {m.facts().name: m.facts() for m in made}


def stored(lm: LocalModel, node: MakeNode | None, report: IdleReport | None = None
           ) -> dict[str, Any]:
    """The LocalModel as the API returns it: placed on ``node`` (None: on no
    node), its idle state written over the plain path's status."""
    [result] = desired_state([lm], [node.facts()] if node else [], now=PLACED_AT,
                             ready={lm.key: {0: True}}).models
    status = with_idle(result.status, report, lm, PLACED_AT)
    body = lm.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    return {**body, "status": status_body(status)}


def waking(wanted: str = WANTED, message: str = "") -> IdleReport:
    home = IdleHome(replica=0, node="small-0", claim="qwen3-weights-0")
    idle = IdleStatus(state="Waking", since=wanted, resident=False, homes=[home],
                      wake=IdleWake(wanted_at=wanted, held=3, node="", message=message))
    return IdleReport(idle, Reason.WAITING_FOR_NODE)


def awake(last_request_at: str, reason: Reason = Reason.SERVING) -> IdleReport:
    return IdleReport(IdleStatus(state="Awake", since=PLACED_AT,
                                 last_request_at=last_request_at), reason)


QWEN3 = MakeLocalModel("qwen3").cpu(4).spec(idle={"after": "30m", "holdSeconds": 120})
EMBED = MakeLocalModel("embed").cpu(4)  # never sleeps
CHAT = MakeLocalModel("chat").cpu(4).spec(idle={"after": "30m", "priority": 10})
BATCH = MakeLocalModel("batch").cpu(4).spec(idle={"after": "30m", "priority": 0})


def scenario(**replace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """ai/qwen3 (priority 0) wants to wake: its home small-0 is held by ai/embed,
    which never sleeps; avx2-0 by ai/chat (priority 10, served 30 s ago); big-0
    has too little memory."""
    models = {
        "qwen3": stored(QWEN3.obj(), None, waking()),
        "embed": stored(EMBED.obj(), SMALL),
        "chat": stored(CHAT.obj(), AVX2, awake(JUST_NOW)),
    }
    return models | replace


def only(findings: list[Finding]) -> Finding:
    [found] = [f for f in findings if f.check == "idle"]
    return found


def test_a_model_that_cannot_wake_is_named_with_every_node_and_why() -> None:
    found = only(idle_findings(scenario().values(), facts(*NODES), NOW))
    assert found.verdict is Verdict.FAIL
    assert found.message.startswith(
        "ai/qwen3 cannot wake (a wake wanted for 5 min, longer than its holdSeconds 120: "
        "held requests got 503): ")
    reasons = found.message.split(": ", 2)[2].split("; ")
    assert reasons == [
        # Home first, then by name.
        "small-0 (home): held by ai/embed: it never sleeps (no spec.idle) "
        "(holds exclusive model ai/embed)",
        "avx2-0: held by ai/chat: priority 10 > 0 (holds exclusive model ai/chat)",
        "big-0: too little free memory (need 3.2 GiB, free 3.0 GiB)",
    ]
    assert "docs/idle.md" in found.fix


@pytest.mark.parametrize("name, model, node, report, said", [
    ("a lower-priority borrower, idle past the grace, yields",
     BATCH, AVX2, awake("2026-12-01T21:00:00Z"),
     "avx2-0: fits once ai/batch yields (it may: idle, priority <= 0); the operator asks it"),
    ("a borrower still serving keeps the node",
     BATCH, AVX2, awake("2026-12-01T21:09:50Z"),
     "avx2-0: held by ai/batch: it has been idle only 10 s (grace 30 s)"),
    ("a higher-priority borrower idle past its own `after` yields",
     CHAT, AVX2, awake("2026-12-01T20:30:00Z"),
     "avx2-0: fits once ai/chat yields"),
    ("a borrower whose activity is unknown is not counted on",
     BATCH, AVX2, awake(""),
     "avx2-0: held by ai/batch: no activity reading from every replica yet"),
    ("a borrower inside an awake window never yields",
     MakeLocalModel("batch").cpu(4).spec(idle={
         "after": "30m", "awake": [{"from": "21:00", "to": "22:00"}]}),
     AVX2, awake("2026-12-01T20:00:00Z"),
     "avx2-0: held by ai/batch: it is inside an awake window"),
    ("an empty node that fits: the next pass places it",
     None, None, None, "avx2-0: fits now; the operator's next pass places it there"),
])
def test_what_each_node_says_follows_the_idle_rules(
    name: str, model: MakeLocalModel | None, node: MakeNode | None,
    report: IdleReport | None, said: str,
) -> None:
    models = scenario(chat=stored(model.obj(), node, report)) if model else {
        k: v for k, v in scenario().items() if k != "chat"}
    found = only(idle_findings(models.values(), facts(*NODES), NOW))
    assert said in found.message, name


def test_a_node_the_model_never_fits_says_the_planners_reason() -> None:
    tainted = MakeNode("gpu-0").cpus(8).memory_gib(32).cpu_flags({"AVX2"}).labels(
        pool="llm").taints(Taint("gpu", "yes", "NoSchedule"))
    labelled = QWEN3.spec(placement={"nodeSelector": {"pool": "llm"}})
    models = scenario(qwen3=stored(labelled.obj(), None, waking()))
    found = only(idle_findings(models.values(), facts(*NODES, tainted), NOW))
    assert "big-0: label pool missing (nodeSelector wants pool=llm)" in found.message
    assert "gpu-0: taint gpu=yes:NoSchedule not tolerated" in found.message


def test_a_wake_within_its_hold_or_an_awake_model_is_not_a_finding() -> None:
    recent = scenario(qwen3=stored(QWEN3.obj(), None, waking(JUST_NOW)))
    [ok] = idle_findings(recent.values(), facts(*NODES), NOW)
    assert (ok.verdict, ok.message) == (
        Verdict.OK, "2 models with spec.idle, none kept from sleeping or waking")
    # Without a clock (a view built without `now`), the wait is not judged.
    assert only(idle_findings(scenario().values(), facts(*NODES), None)).verdict is Verdict.OK


def test_the_operators_own_words_on_the_blocker_are_quoted() -> None:
    said = "waiting for small-0, where ai/embed is serving"
    models = scenario(qwen3=stored(QWEN3.obj(), None, waking(message=said)))
    found = only(idle_findings(models.values(), facts(*NODES), NOW))
    assert f"the operator says: {said}" in found.message


def test_the_router_off_and_an_unclosable_gateway_are_warnings() -> None:
    off = stored(CHAT.obj(), AVX2, awake(JUST_NOW, Reason.ROUTER_OFF))
    [found] = idle_findings([off], facts(*NODES), NOW)
    assert found.verdict is Verdict.WARN
    assert found.message == (
        "ai/chat has spec.idle but never sleeps: the router is off, so nothing would hold "
        "a request while it wakes")
    assert "--router-namespace" in found.fix
    prevented = IdleReport(IdleStatus(state="Awake", since=PLACED_AT), Reason.SLEEP_PREVENTED,
                           "gateway unreachable")
    [found] = idle_findings([stored(CHAT.obj(), AVX2, prevented)], facts(*NODES), NOW)
    assert found.verdict is Verdict.WARN
    assert found.message.startswith("ai/chat cannot sleep: its gateway could not be asked")


@pytest.mark.parametrize("bad", [
    None, "a string", [], {"metadata": "x"},
    {"metadata": {"name": "x", "namespace": "ai"}, "spec": {"idle": {"after": "forever"}}},
    {"metadata": {"name": "y", "namespace": "ai"}, "spec": {"model": "qwen3:1.7b"},
     "status": {"conditions": "not a list", "placements": [{"node": 3}]}},
])
def test_one_unreadable_object_never_stops_the_rest(bad: Any) -> None:
    found = only(idle_findings([bad, *scenario().values()], facts(*NODES), NOW))
    assert found.message.startswith("ai/qwen3 cannot wake")


def test_a_time_zone_the_operator_does_not_know_is_an_invalid_model_not_a_crash() -> None:
    mars = {"after": "30m", "awake": [{"from": "08:00", "to": "18:00", "timeZone": "Mars/Base"}]}
    chat = stored(CHAT.obj(), AVX2, awake(JUST_NOW))
    chat["spec"]["idle"] = mars
    qwen3 = scenario()["qwen3"]
    broken_sleeper = {**qwen3, "spec": {**qwen3["spec"], "idle": mars}}
    found = only(idle_findings([*scenario(chat=chat).values(), broken_sleeper],
                               facts(*NODES), NOW))
    # The occupant is never asked to yield; the sleeper is skipped.
    assert "avx2-0: held by ai/chat: its spec is invalid (Valid=False)" in found.message


def test_an_occupied_node_whose_occupant_cannot_be_read_never_looks_free() -> None:
    embed = scenario()["embed"]
    broken = {**embed, "spec": {**embed["spec"], "cpu": "lots"}}
    found = only(idle_findings(scenario(embed=broken).values(), facts(*NODES), NOW))
    assert "small-0 (home): held by ai/embed: its spec is invalid" in found.message
    assert "(holds exclusive model ai/embed)" in found.message


def test_models_without_idle_say_nothing() -> None:
    assert idle_findings([scenario()["embed"]], facts(*NODES), NOW) == []


def test_the_cluster_check_counts_other_namespaces_nodes_but_names_its_own() -> None:
    models = scenario()
    other = stored(EMBED.named("embed", "search").obj(), SMALL)
    view = ClusterView(nodes=[n.manifest() for n in NODES], pods=[], now=NOW,
                       models=[models["qwen3"], models["chat"], other])
    found = only(cluster_findings(view)[1])
    assert "small-0 (home): held by search/embed: it never sleeps" in found.message
    assert [f for f in cluster_findings(
        ClusterView(nodes=view.nodes, pods=[], now=NOW, models=view.models,
                    namespace="search"))[1] if f.check == "idle"] == []
