"""doctor on models with `spec.idle`: which cannot wake, and why, node by node. Pure.

A wake is wanted (held requests at a router, an awake window's start) and the
model's `Awake` condition has been False for longer than its `holdSeconds`:
every held request has had its 503 by then, so something keeps the model off
every node. For each node, home nodes first (where its node-pinned claims are,
`status.idle.homes`), the reason in the planner's own words (planner/index.py,
the `Unplaced` texts: a selector, a taint, too few CPUs, too little memory) and
the idle rules' (idle/yielding.py `may_yield`: the model holding the node never
sleeps, has a higher priority and is still within its `after`, is inside an
awake window, is serving). Node capacity is counted as the planner counts it:
the replicas the LocalModels' statuses place on the node, each with the CPUs
its placement got and its model's memory; pods that are not LocalModels' are
not counted (doctor reads no usage), so a node may be fuller than it says.

Besides: a model with `spec.idle` that never sleeps because the router is off
(`Awake` reason `RouterOff`: no `--router-namespace`, nothing would hold a
request while it wakes), and one whose gateway could not be asked to close
(`SleepPrevented`). KEDA's `minReplicaCount: 0` on an idle model is not checked
here (doctor reads no ScaledObjects): docs/autoscaling.md says why it is wrong.

Everything read is a stored object: any shape, never trusted; a model that
cannot be read is skipped, one bad object never stops the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from localmodel.api import LocalModel, parse_local_model
from localmodel.api.idle import IdleSpec, unknown_time_zones
from localmodel.api.parse import parse_status
from localmodel.api.status import LocalModelStatus
from localmodel.desired import demand, prepared
from localmodel.doctor.report import Finding, Verdict
from localmodel.errors import InvalidObject
from localmodel.facts import NodeFacts
from localmodel.facts.quantity import parse_bytes
from localmodel.idle.schedule import Window
from localmodel.idle.state import IdlePolicy, Reading, Release
from localmodel.idle.yielding import Candidate, Waker, may_yield
from localmodel.planner import CpuRequest, ModelDemand, Usage
from localmodel.planner.assign import occupy
from localmodel.planner.index import NodeIndex
from localmodel.planner.model import DEFAULT_SETTINGS
from localmodel.printable import printable
from localmodel.status import ConditionType, Reason

__all__ = ["YIELD_GRACE_S", "idle_findings"]

CHECK = "idle"
YIELD_GRACE_S = 30.0  # the operator's --yield-grace default: doctor cannot read the flag
MAX_NODES_SAID = 8  # nodes named per model; the rest counted


@dataclass(frozen=True)
class _Model:
    """One LocalModel as read: its parsed object (None: its spec is invalid) and its status."""

    key: str
    namespace: str
    lm: LocalModel | None
    status: LocalModelStatus | None

    @property
    def idle(self) -> IdleSpec | None:
        return self.lm.spec.idle if self.lm is not None else None


def _read(body: Any) -> _Model | None:
    """A stored LocalModel as doctor reads it: the spec strictly, the status
    tolerantly (as the operator does, controller/objects.py)."""
    if not isinstance(body, Mapping):
        return None
    meta = body.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    status = None
    raw = body.get("status")
    if isinstance(raw, Mapping) and raw:
        try:
            status = parse_status(raw)
        except (ValidationError, RecursionError):
            status = None
    try:
        lm: LocalModel | None = parse_local_model(
            {k: v for k, v in body.items() if k != "status"}, status)
    except InvalidObject:
        lm = None
    if lm is not None and unknown_time_zones(lm.spec.idle):
        lm = None  # invalid to the operator too (Valid=False): its windows cannot be read
    return _Model(printable(key, 300), str(meta.get("namespace") or ""), lm, status)


def policy_of(idle: IdleSpec) -> IdlePolicy:
    """A model's `spec.idle` as the pure core reads it."""
    windows = tuple(Window.of(w.from_, w.to, w.time_zone, w.days or ()) for w in idle.awake)
    return IdlePolicy(idle.after_seconds, idle.priority, Release(idle.release), windows)


def _time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _awake(status: LocalModelStatus | None) -> tuple[str, str, str] | None:
    """(status, reason, lastTransitionTime) of the Awake condition."""
    for c in status.conditions if status is not None else ():
        if c.type == ConditionType.AWAKE.value:
            return str(c.status), c.reason, c.last_transition_time
    return None


def idle_findings(
    models: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, NodeFacts],
    now: datetime | None,
    *,
    scope: str | None = None,
    grace_s: float = YIELD_GRACE_S,
) -> list[Finding]:
    """doctor's `idle` check: every model with `spec.idle` in ``scope`` (a
    namespace; None: all) that cannot wake (each node and why), never sleeps for
    want of the router, or could not be closed. ``models``: every LocalModel
    (those of other namespaces hold nodes too). ``now`` None: how long a wake
    has waited is not judged."""
    read = [m for m in (_read(body) for body in models) if m is not None]
    findings: list[Finding] = []
    sleepers = [m for m in read
                if m.idle is not None and (scope is None or m.namespace == scope)]
    for model in sleepers:
        findings += _model_findings(model, read, nodes, now, grace_s)
    if sleepers and not findings:
        findings.append(Finding(CHECK, Verdict.OK, f"{len(sleepers)} model"
                                f"{'s' if len(sleepers) != 1 else ''} with spec.idle, none kept "
                                "from sleeping or waking"))
    return findings


def _model_findings(model: _Model, every: Sequence[_Model], nodes: Mapping[str, NodeFacts],
                    now: datetime | None, grace_s: float) -> list[Finding]:
    awake = _awake(model.status)
    if awake is None:
        return []
    state, reason, since = awake
    if reason == Reason.ROUTER_OFF.value:
        return [Finding(
            CHECK, Verdict.WARN,
            f"{model.key} has spec.idle but never sleeps: the router is off, so nothing "
            "would hold a request while it wakes",
            "run the router (the chart's router.enabled, which starts the operator with "
            "--router-namespace), or remove spec.idle")]
    if reason == Reason.SLEEP_PREVENTED.value:
        said = _condition_message(model.status)
        return [Finding(
            CHECK, Verdict.WARN,
            f"{model.key} cannot sleep: its gateway could not be asked to close"
            + (f" ({said})" if said else ""),
            "check the operator can reach the gateway's admin port (docs/security.md, "
            "The admin port)")]
    if state != "False" or reason not in (Reason.WAKING.value, Reason.WAITING_FOR_NODE.value):
        return []
    if now is None:
        return []
    return _cannot_wake(model, every, nodes, now, grace_s, since)


def _condition_message(status: LocalModelStatus | None) -> str:
    for c in status.conditions if status is not None else ():
        if c.type == ConditionType.AWAKE.value:
            return printable(c.message, 400)
    return ""


def _cannot_wake(model: _Model, every: Sequence[_Model], nodes: Mapping[str, NodeFacts],
                 now: datetime, grace_s: float, since: str) -> list[Finding]:
    assert model.lm is not None and model.idle is not None
    idle_status = model.status.idle if model.status is not None else None
    wanted = idle_status.wake.wanted_at if idle_status and idle_status.wake else ""
    start = _time(wanted) or _time(since)
    if start is None:
        return []
    waited = (now - start).total_seconds()
    if waited <= model.idle.hold_seconds:
        return []
    homes = {h.node for h in idle_status.homes} if idle_status else set()
    one = replace(demand(model.lm, prepared=prepared(model.lm.spec)), replicas=1)
    waker = Waker(one, policy_of(model.idle), frozenset(homes))
    order = sorted(nodes, key=lambda n: (n not in homes, n))
    said = [_node_reason(nodes[n], n in homes, waker, every, now, grace_s)
            for n in order[:MAX_NODES_SAID]]
    more = f"; and {len(order) - MAX_NODES_SAID} more nodes" if len(order) > MAX_NODES_SAID else ""
    blocker = idle_status.wake.message if idle_status and idle_status.wake else ""
    return [Finding(
        CHECK, Verdict.FAIL,
        f"{model.key} cannot wake (a wake wanted for {_duration(waited)}, longer than its "
        f"holdSeconds {model.idle.hold_seconds}: held requests got 503)"
        + (f"; the operator says: {printable(blocker, 400)}" if blocker else "")
        + ": " + ("; ".join(said) if said else "there are no nodes") + more,
        "free a node it fits (a model that never sleeps can be given spec.idle; a "
        f"higher-priority one yields once idle past its `after`), or lower {model.key}'s "
        "needs (docs/idle.md, The rules)")]


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _occupants(node: str, every: Sequence[_Model]) -> list[tuple[_Model, int, int]]:
    """(model, replica, whole CPUs) of each replica the statuses place on ``node``."""
    found = []
    for m in every:
        for p in m.status.placements if m.status is not None else ():
            if p.node == node:
                found.append((m, p.replica, p.cpu))
    return found


def _occupant_demand(m: _Model, cpus: int, memory: str) -> ModelDemand:
    """The planner's demand of a model on the node; one that cannot be read
    counts as exclusive with what its placement says, so an unknown one never
    lets a node look free (as planner/removal.py does)."""
    if m.lm is not None:
        d = demand(m.lm, prepared=prepared(m.lm.spec))
        if d.memory_bytes:
            return d
    try:
        memory_bytes = parse_bytes(memory)
    except ValueError:
        memory_bytes = 0
    return ModelDemand(m.key, 1, CpuRequest(max(cpus, 1)), memory_bytes)


def _rejection(waker: Waker, node: NodeFacts, held: Sequence[tuple[_Model, int, int]]
               ) -> str | None:
    """The planner's reason the node cannot take one replica of the waker with
    ``held`` on it (None: it fits)."""
    index = NodeIndex([waker.demand], [node], {node.name: Usage()}, DEFAULT_SETTINGS)
    here = index.nodes[node.name]
    for m, replica, cpus in held:
        memory = next((p.memory for p in m.status.placements if p.node == node.name),
                      "0") if m.status else "0"
        occupy(here, _occupant_demand(m, cpus, memory), replica, cpus)
    rejected = index.rejection(here, waker.demand)
    return None if rejected is None else rejected[1]


def _node_reason(node: NodeFacts, home: bool, waker: Waker, every: Sequence[_Model],
                 now: datetime, grace_s: float) -> str:
    name = f"{node.name} (home)" if home else node.name
    held = [o for o in _occupants(node.name, every) if o[0].key != waker.key]
    empty = _rejection(waker, node, [])
    if empty is not None:
        return f"{name}: {empty}"
    why_not = {o[0].key: "its spec is invalid (Valid=False), so it is never asked"
               if o[0].lm is None else may_yield(_candidate(o[0], now), waker, now, grace_s)
               for o in held}
    staying = [o for o in held if why_not[o[0].key] is not None]
    rejected = _rejection(waker, node, staying)
    if rejected is None:
        if len(staying) < len(held):
            leaving = sorted({o[0].key for o in held if why_not[o[0].key] is None})
            return (f"{name}: fits once {', '.join(leaving)} yields (it may: idle, priority "
                    f"<= {waker.policy.priority}); the operator asks it")
        return f"{name}: fits now; the operator's next pass places it there"
    blockers = sorted({o[0].key for o in staying})
    if not blockers:
        return f"{name}: {rejected}"
    held_by = "; ".join(f"{k}: {why_not[k]}" for k in blockers)
    return f"{name}: held by {held_by} ({rejected})"


def _candidate(m: _Model, now: datetime) -> Candidate:
    """What doctor knows of a model on the node: its policy, and a reading from
    its status (idle since status.idle.lastRequestAt; no reading without it)."""
    policy = policy_of(m.idle) if m.idle is not None else None
    idle = m.status.idle if m.status is not None else None
    last = _time(idle.last_request_at) if idle is not None else None
    reading = None if last is None else Reading(0, 0, max(0.0, (now - last).total_seconds()))
    held = idle.wake.held if idle is not None and idle.wake is not None else 0
    return Candidate(m.key, policy, (reading,), held=held)
