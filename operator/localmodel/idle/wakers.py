"""After the plan, for the models with `spec.idle` (`after_plan`): where each
waking model goes and what waking there costs (`status.idle.wake`: its node,
"none" at home, else a new claim and a download), what one the plan left out
waits for, and for each waker the plan left unplaced the model asked to give
it a node (`yielding.choose_yields`: never a busy one, and only an ask: the
gateway decides on its own counts). A sleep-eligible model the plan placed
nowhere only for want of room (it would fit an empty node it may take) waits
for a node as a waker (Waking, WaitingForNode: never Stalled). Pure; the
states before the plan are `decide.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from localmodel.api import IdleStatus, IdleWake
from localmodel.facts import NodeFacts
from localmodel.idle.asks import CloseAsk, CloseResult, IdleSignals
from localmodel.idle.decide import (
    Decided,
    IdleModel,
    ask,
    ask_again,
    cut,
    epoch,
    moved,
    seen_closes,
    stamp,
    stored_since,
)
from localmodel.idle.yielding import Candidate, Waker, choose_yields
from localmodel.idle_status import IdleReport
from localmodel.planner import ModelDemand, Plan, UnplacedReason, Usage
from localmodel.status import Reason


@dataclass(frozen=True)
class IdleOutcome:
    """What a pass decided for the idle models: each one's report (for
    `idle_status.with_idle`) and every close to ask for, in order."""

    reports: Mapping[str, IdleReport] = field(default_factory=lambda: MappingProxyType({}))
    closes: tuple[CloseAsk, ...] = ()
    # The pods ("namespace/pod") whose close a sleep, yield or release under
    # way still needs: the shell renews these leases and lets the others lapse.
    retain: frozenset[str] = frozenset()
    # Seconds until a decision may change with no new signal (a model becomes
    # due to sleep, a hold or reservation ends, a window starts): the shell
    # runs a pass by then. None: no model has an idle state.
    recheck_in: float | None = None


NO_OUTCOME = IdleOutcome()


def after_plan(decided: Decided, models: Sequence[IdleModel], plan: Plan,
               nodes: Mapping[str, NodeFacts], usage: Mapping[str, Usage],
               demands: Mapping[str, ModelDemand], signals: IdleSignals) -> IdleOutcome:
    """Each idle model's report, and every close to ask for: the steps'
    (sleeps, reopens), then the yields for the wakers the plan left
    unplaced. ``demands``: the plan's demands by model key (needed only
    while a model wakes)."""
    reports: dict[str, IdleReport] = {}
    wakers: list[Waker] = []
    by_key = {m.key: m for m in models}
    for key, step in decided.steps.items():
        m = by_key[key]
        idle, awake = step.idle, step.awake
        if idle.state == "Awake" and not m.ready_on and _left_out(key, plan):  # needs a node
            wake = IdleWake(wanted_at=stamp(signals.now))
            idle = moved(idle, "Waking", False, signals.now, wake=wake)
        if idle.state == "Waking":
            idle, awake = _where(m, idle, plan)
            d = demands.get(key)
            if awake is Reason.WAITING_FOR_NODE and d is not None:
                wakers.append(Waker(d, m.policy, frozenset(h.node for h in m.homes)))
        reports[key] = IdleReport(idle, awake)
    closes = [a for s in decided.steps.values() for a in s.asks]
    if wakers:
        # (a failure asks no yield this pass; every model's state still holds)
        with suppress(Exception):
            closes += _yields(wakers, models, decided, plan, nodes, usage, demands, signals)
    closes += _dangling(models, decided, closes, signals)
    return IdleOutcome(MappingProxyType(reports), tuple(closes),
                       _retained(models, decided, closes, signals),
                       RECHECK_S if decided.steps else None)


def _dangling(models: Sequence[IdleModel], decided: Decided, closes: Sequence[CloseAsk],
              signals: IdleSignals) -> list[CloseAsk]:
    """Reopen the closed replicas of a model some of whose replicas closed
    but that nobody asks to close any more (the waker found a node, another
    replica could not be reached): a replica that serves is never left
    refusing work until its lease lapses."""
    asked = {(a.namespace, a.model) for a in closes}
    out = []
    for m in models:
        step = decided.steps.get(m.key)
        if step is None or (m.namespace, m.name) in asked or not step.idle.resident:
            continue
        seen = seen_closes(m, signals, stored_since(m))
        if any(seen.closed) and not all(seen.closed):
            out += [ask(m, i, "reopen") for i, c in enumerate(seen.closed) if c]
    return out


def _left_out(key: str, plan: Plan) -> bool:
    """Whether the plan placed none of the model's replicas only for want of
    room (it would fit an empty node it may take): a sleep-eligible model
    waiting for a node reads Waking, WaitingForNode, and may ask for a yield,
    never Stalled."""
    unplaced = plan.unplaced_for(key)
    return bool(unplaced) and not plan.placements_for(key) and all(
        u.reason is UnplacedReason.NO_FEASIBLE_NODE for u in unplaced)


def _where(m: IdleModel, idle: IdleStatus, plan: Plan) -> tuple[IdleStatus, Reason]:
    """A waking model's node and cost from the plan, or what it waits for."""
    wake = idle.wake or IdleWake()
    placed = plan.placements_for(m.key)
    unplaced = plan.unplaced_for(m.key)
    if unplaced or not placed:
        said = unplaced[0].message if unplaced else "no node can take it now"
        wake = wake.model_copy(update={"message": cut(said)})
        return idle.model_copy(update={"wake": wake}), Reason.WAITING_FOR_NODE
    costs = []
    for a in placed:
        home = m.home(a.replica)
        if home is not None and home != a.node:
            costs.append(f"new claim on {a.node} (the claim on {home} is kept), a download")
    wake = wake.model_copy(update={"node": placed[0].node, "message": "",
                                   "cost": cut("; ".join(costs) or "none")})
    return idle.model_copy(update={"wake": wake}), Reason.WAKING


def _yields(wakers: Sequence[Waker], models: Sequence[IdleModel], decided: Decided,
            plan: Plan, nodes: Mapping[str, NodeFacts], usage: Mapping[str, Usage],
            demands: Mapping[str, ModelDemand], signals: IdleSignals) -> list[CloseAsk]:
    """The closes that ask the chosen models to give the wakers a node."""
    now, grace = signals.now, signals.settings.grace_s
    candidates = []
    by_key = {}
    for m in models:
        step = decided.steps.get(m.key)
        if step is None or step.idle.state == "Waking" or not step.idle.resident:
            continue
        seen = seen_closes(m, signals, stored_since(m))
        if seen.busy or seen.failed:
            continue  # it refused (or could not be asked) within the grace
        waiting = signals.waiting.get(m.key)
        woke = epoch(step.idle.since) if step.idle.state == "Awake" and step.idle.wakes else None
        candidates.append(Candidate(m.key, m.policy, m.readings,
                                    waiting.held if waiting is not None else 0,
                                    None if woke is None else now - woke))
        by_key[m.key] = (m, seen)
    at = datetime.fromtimestamp(now, UTC)
    asks = choose_yields(wakers, candidates, plan, nodes, usage, demands, now=at, grace_s=grace)
    out = []
    for y in asks:
        m, seen = by_key[y.model]
        out += [ask(m, i, "yield", int(grace), y.for_, y.node) for i in range(len(m.pods))
                if ask_again(seen.answers[i], signals)]
    return out


# The longest a pass waits to look at the idle models again when no signal
# came: their time-bound decisions (sleep due, holds, reservations, windows)
# are taken within this of their moment.
RECHECK_S = 15.0


def _retained(models: Sequence[IdleModel], decided: Decided, closes: Sequence[CloseAsk],
              signals: IdleSignals) -> frozenset[str]:
    """The pods whose latest answer the next pass still needs: a close still
    wanted (a model being closed, its other replicas asked, or released this
    pass while its pods go; the shell renews these leases), and a refusal or
    failure younger than ANSWER_KEEP_GRACES graces (it keeps a busy gateway
    from being asked again at once, and says why a model cannot sleep). Not
    a close being reopened."""
    reopened = {f"{a.namespace}/{a.pod}" for a in closes if a.reason == "reopen"}
    out = set()
    for m in models:
        step = decided.steps.get(m.key)
        if step is None:
            continue
        stored = m.stored
        released_now = step.idle.state == "Asleep" and not step.idle.resident and not (
            stored is not None and stored.state == "Asleep" and not stored.resident)
        if released_now or step.idle.resident:
            seen = seen_closes(m, signals, None)
            out |= {f"{m.namespace}/{pod}" for pod, c in zip(m.pods, seen.closed, strict=True)
                    if c}
    horizon = ANSWER_KEEP_GRACES * signals.settings.grace_s
    out |= {pod for pod, c in signals.closes.items()
            if c.result not in (CloseResult.CLOSED, CloseResult.OPENED)
            and signals.now - c.at < horizon}
    return frozenset(out - reopened)


# A refusal or failure is kept for this many graces: the ask is repeated after
# one, and its new answer replaces it long before this.
ANSWER_KEEP_GRACES = 4
