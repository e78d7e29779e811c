"""Who gives a node to a model that must wake (`choose_yield`), never a busy one.

After the plan, outside the planner: for a waker the plan left unplaced, the
placed models that may yield (`may_yield`) are tried in order, one node each,
and the first whose node the waker would fit on once it left
(`planner.fits_after_removal`) is asked. The ask is only that: the model's own
gateway decides on its own counts at the moment of the close (200 closed, or
409 busy), so a stale reading can cost a refused ask, never a busy eviction.

The rules (docs/idle.md):

1. Never a busy one: a candidate with a request in flight or queued, or held
   for it at a router, or idle for less than the grace, is never asked.
2. A model without `spec.idle` never yields (and never wakes: it is no waker).
3. Inside one of its awake windows a model never yields.
4. Priority: within its own `after`, a model yields only to a waker of at
   least its priority; past it (it would be asleep anyway) to any waker, so
   a high-priority borrower gives a sleeper's home back once it idles.
5. Anti-thrash: a model that woke less than the grace ago is not asked.
6. Order: the waker's home node first, then the lowest priority, the longest
   idle, the model's key and the node's name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from localmodel.facts import NodeFacts
from localmodel.idle.schedule import is_awake_window
from localmodel.idle.state import IdlePolicy, Reading, quiet_for
from localmodel.planner import ModelDemand, Plan, Usage, fits_after_removal


@dataclass(frozen=True)
class Waker:
    """A model that must wake (held requests, an awake window's start) or a
    sleep-eligible one left unplaced: its demand, its policy, and the nodes
    its node-pinned claims are on (its homes)."""

    demand: ModelDemand
    policy: IdlePolicy
    homes: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return self.demand.key


@dataclass(frozen=True)
class Candidate:
    """A placed model that might yield: its policy (None: it never sleeps),
    each replica's last reading, the requests held for it at the routers,
    and seconds since it last woke (None: not since the operator knows)."""

    key: str
    policy: IdlePolicy | None
    readings: tuple[Reading | None, ...]
    held: int = 0
    woke_s_ago: float | None = None

    @property
    def idle_s(self) -> float:
        """The least idle time of its replicas (0 without a reading)."""
        return min((r.idle_seconds if r else 0.0 for r in self.readings), default=0.0)


@dataclass(frozen=True)
class YieldAsk:
    """Ask `model`'s gateways to close so that `for_` can take `node`: `reason`
    in words, for the Event."""

    model: str
    node: str
    for_: str
    reason: str


def may_yield(c: Candidate, waker: Waker, now: datetime, grace_s: float) -> str | None:
    """Why ``c`` may not give a node to ``waker`` now (rules 1-5), or None."""
    if c.key == waker.key:
        return "it is the model waking"
    policy = c.policy
    if policy is None:
        return "it never sleeps (no spec.idle)"
    if is_awake_window(policy.windows, now):
        return "it is inside an awake window"
    if c.held:
        return f"{c.held} request(s) wait for it at a router"
    if not quiet_for(c.readings, grace_s):
        return _busy(c.readings, grace_s)
    if c.woke_s_ago is not None and c.woke_s_ago < grace_s:
        return f"it woke {c.woke_s_ago:.0f} s ago"
    if policy.priority > waker.policy.priority and not quiet_for(c.readings, policy.after_s):
        return f"priority {policy.priority} > {waker.policy.priority}"
    return None


def _busy(readings: Sequence[Reading | None], grace_s: float) -> str:
    """Why the readings are not quiet for ``grace_s``, in words."""
    if not readings or any(r is None for r in readings):
        return "no activity reading from every replica yet"
    known = [r for r in readings if r is not None]
    in_flight, queued = sum(r.in_flight for r in known), sum(r.queued for r in known)
    if in_flight or queued:
        return f"it is serving ({in_flight} in flight, {queued} queued)"
    idle = min(r.idle_seconds for r in known)
    return f"it has been idle only {idle:.0f} s (grace {grace_s:.0f} s)"


def choose_yield(
    waker: Waker,
    candidates: Iterable[Candidate],
    plan: Plan,
    nodes: Mapping[str, NodeFacts],
    usage: Mapping[str, Usage],
    demands: Mapping[str, ModelDemand],
    *,
    now: datetime,
    grace_s: float,
    skip_nodes: frozenset[str] = frozenset(),
) -> YieldAsk | None:
    """The model to ask to give a node to ``waker``, or None: the first, in
    rule 6's order, that may yield and whose node (one of its replicas'; not
    in ``skip_nodes``) ``waker`` would fit on once it left."""
    tries: list[tuple[tuple[bool, int, float, str, str], Candidate]] = []
    for c in candidates:
        if c.policy is None or may_yield(c, waker, now, grace_s) is not None:
            continue
        for a in plan.placements_for(c.key):
            if a.node in nodes and a.node not in skip_nodes:
                order = (a.node not in waker.homes, c.policy.priority, -c.idle_s, c.key, a.node)
                tries.append((order, c))
    for order, c in sorted(tries, key=lambda t: t[0]):
        node = order[4]
        if fits_after_removal(waker.demand, nodes[node], plan, demands, c.key, usage.get(node)):
            return YieldAsk(c.key, node, waker.key, _reason(c, waker, node))
    return None


def _reason(c: Candidate, waker: Waker, node: str) -> str:
    assert c.policy is not None
    home = f"{waker.key}'s home " if node in waker.homes else ""
    mine, theirs = c.policy.priority, waker.policy.priority
    rank = f"priority {mine} <= {theirs}" if mine <= theirs else f"past its after, priority {mine}"
    return f"gave {home}{node} to {waker.key}: idle {c.idle_s:.0f} s, {rank}"


def choose_yields(
    wakers: Iterable[Waker],
    candidates: Sequence[Candidate],
    plan: Plan,
    nodes: Mapping[str, NodeFacts],
    usage: Mapping[str, Usage],
    demands: Mapping[str, ModelDemand],
    *,
    now: datetime,
    grace_s: float,
) -> tuple[YieldAsk, ...]:
    """`choose_yield` for each waker, the highest priority first (then by
    key): each candidate asked once, each node given once."""
    asks: list[YieldAsk] = []
    asked: set[str] = set()
    given: set[str] = set()
    for w in sorted(wakers, key=lambda w: (-w.policy.priority, w.key)):
        left = [c for c in candidates if c.key not in asked]
        ask = choose_yield(w, left, plan, nodes, usage, demands, now=now, grace_s=grace_s,
                           skip_nodes=frozenset(given))
        if ask is not None:
            asks.append(ask)
            asked.add(ask.model)
            given.add(ask.node)
    return tuple(asks)
