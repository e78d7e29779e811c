"""What must change for the models with `spec.idle` this pass (`decide`, then
`after_plan`): each one's state (Awake, Asleep resident or released, Waking),
the closes to ask its gateways for, and what the planner must be told. Pure.

The state survives a restart through `status.idle` alone: each pass starts
from the stored one and moves it by what the shell saw (`IdleSignals`: the
routers' held requests, the answers to the last closes, each replica's
activity reading, the clock). Before the plan (`decide`):

- a model due to sleep (every replica quiet for `after`, nothing held, outside
  its awake windows; a missing or stale reading is not quiet) falls asleep:
  `OnDemand` at once, resident (its pods stay and serve); `WhenAsleep` once
  each replica's gateway accepted a `sleep` close;
- a model whose every replica's gateway answered `closed` (a sleep, or a yield
  to a waker) is released: no demand, its pods go by the scale-down path, its
  claims stay; a yield's node is reserved for its waker (`wake.node`,
  `reserved`, from `since`, for `IdleSettings.reserve_s`);
- a close that one replica refused (409) reopens the replicas that closed;
- a released model that is wanted (a request held for it, an awake window,
  no router to hold) wakes; a resident sleeper that is wanted or served a
  request is awake at once; a waking model is awake at its first Ready replica;
- the planner's inputs (`IdleInputs`): released models have no demand; the
  others prefer their homes (the nodes their node-pinned claims are on) or
  the node reserved for them; a pending model without `spec.idle` avoids every
  released sleeper's home (rule 4: a lent node goes only to models that may
  sleep), and every other pending model avoids a node reserved for a waker.

After the plan, `wakers.after_plan`: where each waking model goes, and who is
asked to give a node to one left unplaced. `replicas: 0` is off, not asleep:
such a model is no `IdleModel` (no idle state at all), nor is one whose spec
is invalid.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from localmodel.api import IdleHome, IdleLastWake, IdleStatus, IdleWake
from localmodel.api.status import STATUS_TEXT_MAX
from localmodel.idle.asks import CloseAsk, Closed, CloseReason, CloseResult, IdleSignals
from localmodel.idle.schedule import is_awake_window
from localmodel.idle.state import IdlePolicy, Reading, Release, due_to_sleep
from localmodel.speed import Reading as SpeedReading
from localmodel.status import Reason

_FAILED = frozenset({CloseResult.FORBIDDEN, CloseResult.UNREACHABLE, CloseResult.BAD})


@dataclass(frozen=True)
class IdleModel:
    """One valid model with `spec.idle` and `replicas > 0`, as a pass sees it:
    its policy and hold time, each replica's pod name, its stored
    `status.idle`, each replica's last activity (None: missing or stale), its
    homes (node-pinned claims) and the nodes of its Ready replicas."""

    key: str  # "namespace/name"
    policy: IdlePolicy
    pods: tuple[str, ...]  # per replica (spec.replicas of them)
    hold_s: float = 120.0
    stored: IdleStatus | None = None
    readings: tuple[Reading | None, ...] = ()
    homes: tuple[IdleHome, ...] = ()
    ready_on: tuple[str, ...] = ()
    last_request: float | None = None  # seconds: the latest a replica saw one (`last_request`)
    ips: tuple[str, ...] = ()  # per replica, its pod's address ("" if none): where a close goes

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]

    def home(self, replica: int) -> str | None:
        return next((h.node for h in self.homes if h.replica == replica), None)


@dataclass(frozen=True)
class IdleInputs:
    """What the idle decisions tell the planner this pass, given to both the
    plain path (`desired.desired_state`) and the memo layers
    (`incremental.Desired`): `released`, the models with no demand; `prefer`,
    per model a node per replica (its home, or the node reserved for it);
    `avoid`, per model nodes it must not take (added to the scheduler's)."""

    released: frozenset[str] = frozenset()
    prefer: Mapping[str, tuple[str | None, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    avoid: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    def demand_of(self, key: str) -> tuple[bool, tuple[str | None, ...], frozenset[str]]:
        """What one model's demand takes from here: released, prefer, avoid."""
        return (key in self.released, self.prefer.get(key, ()),
                self.avoid.get(key, frozenset()))


NO_IDLE = IdleInputs()


@dataclass(frozen=True)
class Step:
    """One model's state after this pass's signals, before the plan: its
    `status.idle`, the Awake reason, and the closes to ask for."""

    idle: IdleStatus
    awake: Reason
    asks: tuple[CloseAsk, ...] = ()


@dataclass(frozen=True)
class Decided:
    """`decide`'s answer: each model's step and the planner's inputs."""

    steps: Mapping[str, Step]
    inputs: IdleInputs = NO_IDLE

    @property
    def waking(self) -> bool:
        return any(s.idle.state == "Waking" for s in self.steps.values())


def stamp(seconds: float) -> str:
    """RFC 3339, whole seconds, UTC (as the operator writes every time)."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(text: str) -> float | None:
    """A stored RFC 3339 time in seconds; None when empty or unreadable
    (status is read as anyone may have written it)."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def cut(text: str, limit: int = STATUS_TEXT_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fresh_readings(readings: Mapping[int, SpeedReading], replicas: int, now: float,
                   stale_s: float) -> tuple[Reading | None, ...]:
    """Each replica's activity as the core reads it: None when missing, from
    a gateway without the signal, or older than ``stale_s`` (unknown is not idle)."""
    out: list[Reading | None] = []
    for replica in range(replicas):
        r = readings.get(replica)
        activity = r.activity if r is not None else None
        if r is None or activity is None or now - r.at > stale_s:
            out.append(None)
            continue
        out.append(Reading(activity.in_flight, activity.queued, activity.idle_seconds))
    return tuple(out)


def last_request(readings: Mapping[int, SpeedReading], now: float,
                 stale_s: float) -> float | None:
    """When a replica last saw a request, by the fresh readings (each one's
    time less its idle seconds); None when none says."""
    times = [r.at - r.activity.idle_seconds for r in readings.values()
             if r.activity is not None and now - r.at <= stale_s]
    return max(times, default=None)


# lastRequestAt moves by whole steps of this many seconds: it says roughly when,
# and a busy model's status is not rewritten on every read.
LAST_REQUEST_STEP = 300.0


def _with_last(stored: IdleStatus, last: float | None) -> IdleStatus:
    if last is None:
        return stored
    was = epoch(stored.last_request_at)
    if was is not None and last < was + LAST_REQUEST_STEP:
        return stored
    return stored.model_copy(update={"last_request_at": stamp(last // 60 * 60)})


# ---- before the plan ---------------------------------------------------------------


def decide(models: Sequence[IdleModel], signals: IdleSignals, *,
           pending: Collection[str] = (), plain: Collection[str] = ()) -> Decided:
    """Each idle model's step and the planner's inputs. ``pending``: the
    models (any, valid) with a replica not placed now; ``plain``: the models
    without `spec.idle` (rule 4). A model whose step raises keeps its stored
    state and no report (one bad object never stops the rest)."""
    at = datetime.fromtimestamp(signals.now, UTC)
    steps: dict[str, Step] = {}
    for m in models:
        try:
            steps[m.key] = _step(m, signals, at)
        except Exception:  # one model's failure is that model's: left as it is
            continue
    steps = _granted(steps, models, signals)
    return Decided(MappingProxyType(steps), _inputs(models, steps, pending, plain))


@dataclass(frozen=True)
class Seen:
    """What one model's closes say this pass."""

    closed: tuple[bool, ...]  # per replica: closed now (within its lease)
    answers: tuple[Closed | None, ...]  # per replica: the answer since its state began
    busy: bool  # a replica refused within the grace
    failed: bool  # the latest answer of a replica is a failure


def seen_closes(m: IdleModel, signals: IdleSignals, since: float | None) -> Seen:
    now, grace = signals.now, signals.settings.grace_s
    answers = tuple(
        c if c is not None and (since is None or c.at >= since) else None
        for c in (signals.closes.get(f"{m.namespace}/{pod}") for pod in m.pods))
    closed = tuple(c is not None and c.result is CloseResult.CLOSED and c.ask.reason != "reopen"
                   and now < c.at + c.lease_seconds for c in answers)
    busy = any(c is not None and c.result is CloseResult.BUSY and now - c.at < grace
               for c in answers)
    failed = any(c is not None and c.result in _FAILED for c in answers)
    return Seen(closed, answers, busy, failed)


def stored_since(m: IdleModel) -> float | None:
    """Since when the model is in its stored state: the answers older than
    that were to an earlier one (None: first sight, or unreadable; any counts)."""
    return epoch(m.stored.since) if m.stored is not None else None


def _step(m: IdleModel, signals: IdleSignals, at: datetime) -> Step:
    stored = m.stored or IdleStatus(state="Awake", since=stamp(signals.now))
    stored = _with_last(stored.model_copy(update={"homes": list(m.homes)}), m.last_request)
    seen = seen_closes(m, signals, stored_since(m))
    waiting = signals.waiting.get(m.key)
    held = waiting.held if waiting is not None else 0
    wanted = held > 0 or is_awake_window(m.policy.windows, at) or not signals.settings.router
    released = stored.state == "Asleep" and not stored.resident
    router = signals.settings.router  # without one nothing sleeps: a close is undone
    if router and stored.state != "Waking" and not released and m.pods and all(seen.closed):
        return _release(stored, seen)
    reopen = tuple(ask(m, i, "reopen") for i, c in enumerate(seen.closed)
                   if c and (seen.busy or not router))
    if stored.state == "Waking":
        return _waking(m, stored, signals, wanted, held)
    if released:
        if not wanted:
            return Step(stored, Reason.ASLEEP)
        wake = IdleWake(wanted_at=stamp(signals.now), held=held)
        return Step(moved(stored, "Waking", False, signals.now, wake=wake), Reason.WAKING)
    awake = stored.state == "Awake"
    # Awake, it sleeps once known to be quiet; a resident sleeper (its pods
    # serve) stays asleep until wanted or a reading shows a request.
    due = (not wanted and not seen.busy
           and due_to_sleep(m.policy, m.readings, held, at) if awake
           else not (wanted or seen.busy or _active(m.readings, m.policy.after_s)))
    if not due:
        now_awake = stored if awake else moved(stored, "Awake", True, signals.now)
        return Step(now_awake, _awake_reason(m, seen, signals), reopen)
    if m.policy.release is Release.ON_DEMAND:
        asleep = stored if not awake else moved(stored, "Asleep", True, signals.now)
        return Step(asleep, Reason.ASLEEP, reopen)
    asks = tuple(ask(m, i, "sleep", int(m.policy.after_s)) for i in range(len(m.pods))
                 if ask_again(seen.answers[i], signals))
    return Step(stored, Reason.ASLEEP if not awake else _awake_reason(m, seen, signals), asks)


def _active(readings: Sequence[Reading | None], after_s: float) -> bool:
    """Whether a reading shows a request in the last ``after_s`` (an unknown
    one shows none: a resident sleeper whose reading is missing stays)."""
    return any(r is not None and (r.in_flight or r.queued or r.idle_seconds < after_s)
               for r in readings)


def ask_again(last: Closed | None, signals: IdleSignals) -> bool:
    """Whether to (re)send a close to a replica whose last answer is ``last``:
    none yet; a refusal or failure older than the grace; a close whose lease
    lapsed. A close within its lease is renewed by the shell while the pass
    retains it (`wakers.IdleOutcome.retain`), not asked again."""
    if last is None:
        return True
    age = signals.now - last.at
    if last.result is CloseResult.CLOSED:
        return age >= last.lease_seconds
    return age >= signals.settings.grace_s


def ask(m: IdleModel, replica: int, reason: CloseReason, idle_at_least: int = 0,
         for_: str = "", node: str = "") -> CloseAsk:
    ip = m.ips[replica] if replica < len(m.ips) else ""
    return CloseAsk(m.namespace, m.name, m.pods[replica], reason, idle_at_least, for_=for_,
                    ip=ip, node=node)


def _awake_reason(m: IdleModel, seen: Seen, signals: IdleSignals) -> Reason:
    if not signals.settings.router:
        return Reason.ROUTER_OFF
    if seen.failed:
        return Reason.SLEEP_PREVENTED
    serving = any(r is not None and (r.in_flight or r.queued) for r in m.readings)
    return Reason.SERVING if serving else Reason.IDLE


def moved(stored: IdleStatus, state: str, resident: bool, at: float,
           **update: object) -> IdleStatus:
    keep = {"wake": None} if state != "Waking" else {}
    return stored.model_copy(update={"state": state, "resident": resident, "since": stamp(at),
                                     **keep, **update})


def _release(stored: IdleStatus, seen: Seen) -> Step:
    """Every replica closed: asleep and released, since the last close."""
    answers = [c for c in seen.answers if c is not None]
    yielded = any(c.ask.reason == "yield" for c in answers)
    last = max(c.at for c in answers)
    idle = moved(stored, "Asleep", False, last, yields=stored.yields + int(yielded))
    return Step(idle, Reason.ASLEEP)


def _waking(m: IdleModel, stored: IdleStatus, signals: IdleSignals, wanted: bool,
            held: int) -> Step:
    """A waking model: awake at its first Ready replica; back asleep when
    nothing wants it any more, its hold time passed and none of its pods has
    an address yet (one that has may already serve: the router relays a held
    request the moment it sees the replica Ready, which ends the hold before
    this pass sees the pod Ready, and a pod goes only after its gateway
    closed, rule 1); its reservation lapses after `reserve_s`."""
    now = signals.now
    wake = stored.wake or IdleWake()
    wanted_at = epoch(wake.wanted_at) or epoch(stored.since) or now
    if m.ready_on:
        node = m.ready_on[0]
        last = IdleLastWake(seconds=round(max(0.0, now - wanted_at), 1), node=node,
                            warm_cache=node in {h.node for h in m.homes})
        idle = moved(stored, "Awake", True, now, wakes=stored.wakes + 1, last_wake=last)
        return Step(idle, Reason.SERVING)
    if not wanted and now - wanted_at >= m.hold_s and not any(m.ips):
        return Step(moved(stored, "Asleep", False, now), Reason.ASLEEP)
    since = epoch(stored.since)
    if wake.reserved and (since is None or now >= since + signals.settings.reserve_s):
        wake = wake.model_copy(update={"reserved": False})
    return Step(stored.model_copy(update={"wake": wake.model_copy(update={"held": held})}),
                Reason.WAKING)


def _granted(steps: dict[str, Step], models: Sequence[IdleModel],
             signals: IdleSignals) -> dict[str, Step]:
    """A model released this pass by a yield reserves the node it gave for
    its waker, from the moment it closed."""
    for m in models:
        step = steps.get(m.key)
        if step is None or step.idle.state != "Asleep" or step.idle.resident:
            continue
        if m.stored is not None and m.stored.state == "Asleep" and not m.stored.resident:
            continue  # released before this pass: granted then
        answers = [signals.closes.get(f"{m.namespace}/{pod}") for pod in m.pods]
        gave = {(c.ask.for_, c.ask.node) for c in answers
                if c is not None and c.ask.reason == "yield" and c.ask.for_ and c.ask.node}
        for waker, node in sorted(gave):
            w = steps.get(waker)
            if w is None or w.idle.state != "Waking" or step.idle.since < w.idle.since:
                continue
            wake = (w.idle.wake or IdleWake()).model_copy(update={"node": node,
                                                                   "reserved": True})
            steps[waker] = Step(w.idle.model_copy(update={"wake": wake,
                                                          "since": step.idle.since}),
                                w.awake, w.asks)
    return steps


def _inputs(models: Sequence[IdleModel], steps: Mapping[str, Step], pending: Collection[str],
            plain: Collection[str]) -> IdleInputs:
    released = frozenset(k for k, s in steps.items()
                         if s.idle.state == "Asleep" and not s.idle.resident)
    prefer: dict[str, tuple[str | None, ...]] = {}
    reserved: dict[str, str] = {}
    lent: set[str] = set()
    for m in models:
        step = steps.get(m.key)
        if step is None:
            continue
        if m.key in released:
            lent.update(h.node for h in m.homes)
            continue
        wake = step.idle.wake
        mine = wake.node if wake is not None and wake.reserved and wake.node else None
        if mine is not None:
            reserved[m.key] = mine
        per = tuple(mine or m.home(r) for r in range(len(m.pods)))
        if any(per):
            prefer[m.key] = per
    avoid: dict[str, frozenset[str]] = {}
    plain_set = frozenset(plain)
    for key in sorted(pending):
        if key in released:
            continue
        nodes = {n for w, n in reserved.items() if w != key}
        if key in plain_set:
            nodes |= lent
        if nodes:
            avoid[key] = frozenset(nodes)
    return IdleInputs(released, MappingProxyType(prefer), MappingProxyType(avoid))
