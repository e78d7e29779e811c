"""The status of a model with `spec.idle`: Ready and Placed while it sleeps or
wakes, and the informational Awake condition. Pure.

The operator works a model's status out on the plain path first (status.py,
then its roll, the cluster's gaps and its speed: controller/model_work.py);
for a model with `spec.idle`, `with_idle` then says what its idle state changes
(`IdleReport`: the `status.idle` to write and the Awake condition's reason):

- asleep: Ready=True, reason Asleep (the spec asks for a model that serves on
  demand, and it does), and Placed=True, reason Asleep, for each replica whose
  pod was released (never Placed=False, which reads Stalled);
- waking: Ready=True, reason Waking, while its pods start (Progressing still
  tells of their start, but a wake is no roll: it writes no Reconciling);
- a gap (status.GAP_REASONS: an image that cannot be pulled, a container that
  keeps failing, ...) stays Ready=False with its reason, asleep or waking: it is
  broken, and reads InProgress; but a waking pod the scheduler left
  Unschedulable is the wake waiting for its node (the model yielding it may
  still be leaving: seen on the real node), Ready=True Waking;
- the kstatus pair is worked out again from the result (`status.with_health`),
  so sleep alone writes neither Reconciling nor Stalled: kstatus reads Current,
  Argo CD Healthy (docs/gitops.md).

A model without `spec.idle`, or with no report, keeps its status as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.api import Condition, ConditionStatus, IdleStatus, LocalModel, LocalModelStatus
from localmodel.status import GAP_REASONS, ConditionType, Reason, condition, with_health

# The Awake condition's reasons and its status for each. An awake model that
# cannot sleep (no router to hold a request while it wakes; its gateway could
# not be reached to close) is still awake and serving: True, with why it stays.
AWAKE_REASONS: dict[Reason, bool] = {
    Reason.SERVING: True,
    Reason.IDLE: True,
    Reason.ROUTER_OFF: True,
    Reason.SLEEP_PREVENTED: True,
    Reason.ASLEEP: False,
    Reason.WAKING: False,
    Reason.WAITING_FOR_NODE: False,
}

# Which Awake reasons each state may carry.
_REASONS_OF_STATE: dict[str, frozenset[Reason]] = {
    "Awake": frozenset({Reason.SERVING, Reason.IDLE, Reason.ROUTER_OFF,
                        Reason.SLEEP_PREVENTED}),
    "Asleep": frozenset({Reason.ASLEEP, Reason.WAITING_FOR_NODE}),
    "Waking": frozenset({Reason.WAKING, Reason.WAITING_FOR_NODE}),
}


@dataclass(frozen=True)
class IdleReport:
    """What the operator's idle book says of one model this pass: its
    `status.idle`, the Awake condition's reason (one `idle.state` may carry,
    AWAKE_REASONS) and, if the reason's own words are not enough, its message
    (no clock reading in it: a message that changes each pass is a status
    write each pass)."""

    idle: IdleStatus
    awake: Reason
    message: str = ""

    def __post_init__(self) -> None:
        if self.awake not in _REASONS_OF_STATE[self.idle.state]:
            raise ValueError(f"state {self.idle.state} cannot be Awake reason {self.awake}")


def with_idle(status: LocalModelStatus, report: IdleReport | None, lm: LocalModel,
              now: str) -> LocalModelStatus:
    """The status of a model with `spec.idle` in the state `report` says (the
    module's docstring says what each changes). No report, no `spec.idle`, or
    an invalid spec: `status` as it is."""
    idle = lm.spec.idle
    if report is None or idle is None or _false(status, ConditionType.VALID):
        return status
    state = report.idle.state
    conditions = list(status.conditions)
    if state in ("Asleep", "Waking"):
        conditions = _sleeping(conditions, status, report, lm, now)
    awake = condition(ConditionType.AWAKE, AWAKE_REASONS[report.awake], report.awake,
                      report.message or _awake_words(report, idle.after), lm, now)
    conditions = [*(c for c in conditions if c.type != ConditionType.AWAKE.value), awake]
    stored = lm.status.idle if lm.status is not None else None
    out = status.model_copy(update={
        "conditions": conditions,
        # `status.replicas` counts awake replicas: none while asleep (scale reads it)
        "replicas": 0 if state == "Asleep" else status.replicas,
        "idle": stored if stored == report.idle else report.idle})
    if state in ("Asleep", "Waking"):
        return _sleeping_health(out, lm, now)
    return with_health(out, lm.metadata.generation, lm.status, now)


_PAIR = (ConditionType.RECONCILING.value, ConditionType.STALLED.value)


def _sleeping_health(status: LocalModelStatus, lm: LocalModel, now: str) -> LocalModelStatus:
    """The kstatus pair of a model asleep or waking: its pods starting are the
    wake, not a roll to wait for, so Progressing (which still tells of the
    start) makes it no Reconciling; a gap still does (InProgress)."""
    progressing = ConditionType.PROGRESSING.value
    without = status.model_copy(update={
        "conditions": [c for c in status.conditions if c.type != progressing]})
    health = with_health(without, lm.metadata.generation, lm.status, now)
    pair = [c for c in health.conditions if c.type in _PAIR]
    kept = [c for c in status.conditions if c.type not in _PAIR]
    return status.model_copy(update={"conditions": [*kept, *pair]})


def _false(status: LocalModelStatus, type_: ConditionType) -> Condition | None:
    c = next((c for c in status.conditions if c.type == type_.value), None)
    return c if c is not None and c.status == ConditionStatus.FALSE else None


def _sleeping(conditions: list[Condition], status: LocalModelStatus, report: IdleReport,
              lm: LocalModel, now: str) -> list[Condition]:
    """Ready and Placed of a model asleep or waking (a gap stays a gap, but a
    waking pod the scheduler cannot place yet is the wake waiting for its node:
    the model that yields it may still be leaving it)."""
    gaps = GAP_REASONS - {Reason.UNSCHEDULABLE} if report.idle.state == "Waking" else GAP_REASONS
    out = []
    for c in conditions:
        if c.type == ConditionType.READY.value and c.status != ConditionStatus.UNKNOWN and not (
                c.status == ConditionStatus.FALSE and c.reason in gaps):
            c = _ready(report, lm, now)
        elif c.type == ConditionType.PLACED.value and (
                c.status == ConditionStatus.FALSE
                or len(status.placements) < lm.spec.replicas):  # released: none placed
            c = condition(ConditionType.PLACED, True, Reason.ASLEEP,
                          _released_words(status, report, lm), lm, now)
        out.append(c)
    return out


def _ready(report: IdleReport, lm: LocalModel, now: str) -> Condition:
    idle, after = report.idle, lm.spec.idle.after if lm.spec.idle else ""
    if idle.state == "Asleep":
        kept = ("its pods still serve at once until another model needs the node"
                if idle.resident else "a request through the router wakes it")
        message = f"asleep since {idle.since or 'now'} (no request for {after}); {kept}"
        return condition(ConditionType.READY, True, Reason.ASLEEP, message, lm, now)
    return condition(ConditionType.READY, True, Reason.WAKING, _waking_words(idle), lm, now)


def _waking_words(idle: IdleStatus) -> str:
    wake = idle.wake
    if wake is None:
        return f"waking since {idle.since or 'now'}"
    where = f"on {wake.node}" if wake.node else "(no node yet)"
    held = f" for {wake.held} held request{'s' if wake.held != 1 else ''}" if wake.held else ""
    since = f" since {wake.wanted_at}" if wake.wanted_at else ""
    said = f": {wake.message}" if wake.message else ""
    return f"waking {where}{held}{since}{said}"


def _released_words(status: LocalModelStatus, report: IdleReport, lm: LocalModel) -> str:
    """Each replica with no pod: asleep, and where its claim keeps its weights."""
    placed = {p.replica for p in status.placements}
    homes = {h.replica: h for h in report.idle.homes}
    said = []
    for replica in range(lm.spec.replicas):
        if replica in placed:
            continue
        home = homes.get(replica)
        where = f"; its claim {home.claim} is on {home.node}" if home else ""
        said.append(f"replica {replica} asleep{where}")
    return "; ".join(said) or "asleep"


def _awake_words(report: IdleReport, after: str) -> str:
    idle = report.idle
    if report.awake == Reason.SERVING:
        return f"serving; it sleeps after {after} without a request"
    if report.awake == Reason.IDLE:
        last = f" since {idle.last_request_at}" if idle.last_request_at else ""
        return f"no request{last}; it sleeps after {after} without one"
    if report.awake == Reason.ROUTER_OFF:
        return ("never sleeps: the operator runs no router (--router-namespace), so nothing "
                "would hold a request while it wakes")
    if report.awake == Reason.SLEEP_PREVENTED:
        return "cannot sleep: its gateway could not be reached to close it"
    if report.awake == Reason.ASLEEP:
        return f"asleep since {idle.since or 'now'}"
    if report.awake == Reason.WAITING_FOR_NODE:
        said = idle.wake.message if idle.wake and idle.wake.message else "no node can take it now"
        return f"waiting for a node: {said}"
    return _waking_words(idle)
