"""Speed where it is served: what to expect of a replica, and when it is slow. Pure.

Each gateway measures its own replica (gateway/speed.py): a calibration at
readiness (a fixed decode, before the pod reports Ready) and the engine's own
timings of real traffic. The operator reads those numbers (controller/speed.py
does the reading) and this module decides, from values only:

* **What to expect** (`expected_speed`): a replica's peers are the replicas
  running the same model on the same engine image with the same thread count
  on nodes of the same CPU model (vendor, family, model id, from the node
  facts the operator already reads), and only those whose numbers a tenant
  cannot fake: the caller passes only vouched replicas' calibrations
  (controller/speed.py: a replica whose gateway runs the operator's own
  image). Outliers among the peers are dropped (`inliers`: further than
  OUTLIER_SPREADS robust spreads from their median); the expected decode
  (prefill) rate is the median of the rest; with no peers, the replica's own
  calibration. A node whose CPU model is not known has no peers: two unknown
  CPUs are not known to be alike. Where the node's memory bandwidth is known,
  the replica's decode ceiling (`localmodel.ceiling`: bandwidth over bytes read
  per token) sets a floor under that expectation: the expected decode rate is
  the higher of the calibrations' and CEILING_SHARE of the ceiling, so a
  replica slow like all its peers (or since its own calibration) is still
  judged against what its node's memory allows.
* **When it is slow** (`step`): a replica is slow once its decode rate from
  real traffic stays below `slow_ratio` (50%) of the expected rate for
  `slow_after` seconds (10 minutes) of traffic, and it stops being slow only
  once it stays at or above `clear_ratio` (70%) for `clear_after` seconds
  (2 minutes) of traffic. The gap between the two ratios and the two times
  is the hysteresis: a replica hovering around 50% does not flap. Time
  without traffic counts for neither: an idle replica keeps its state.
* **When to read a gateway** (`next_read`): a replica is read once when its
  pod becomes Ready (its calibration), then every `interval` while the last
  read found traffic since the one before; after a read that found none (the
  readiness read included) or failed, the next waits `idle_max`. At most one
  small read per replica per interval, and an idle model costs one read per
  `idle_max` (10 minutes); the price is that traffic starting on an idle
  replica is first seen up to `idle_max` later. A model with `spec.idle` is
  read at least every min(after / 4, 60 s) (`idle_read_every`) whatever its
  traffic: its activity decides when it sleeps.
* **What goes into status** (`worth_publishing`): rates that moved by 10% or
  more, a new calibration or expectation, a change of state, or numbers older
  than `publish_max`: a model under steady traffic writes its status at most
  every few minutes, not once per read.

Tables in tests/controller/test_speed.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

# Defaults of the operator's flags (controller/config.py), documented in docs/operator.md.
SLOW_RATIO = 0.5
CLEAR_RATIO = 0.7
SLOW_AFTER_SECONDS = 600.0
CLEAR_AFTER_SECONDS = 120.0
READ_INTERVAL_SECONDS = 30.0
IDLE_MAX_SECONDS = 600.0
PUBLISH_MAX_SECONDS = 300.0
PUBLISH_CHANGE = 0.10  # a rate that moved this much (relative) is written at once
# Tokens per second no CPU replica reaches: the fastest prefill measured here is about
# 250 tok/s on 2 CPUs (docs/benchmarks.md), a hundred times that on a 128-core node is
# 25k. A rate above it is a lie or an artefact (a few tokens in the gateway's 1 us
# rounding of seconds) and counts as not measured, which keeps every median, ratio
# and status number finite.
MAX_RATE = 1e6

# Outliers among peers' calibrations (`inliers`): a value further from the median
# than OUTLIER_SPREADS spreads is dropped, the spread being the median absolute
# deviation scaled to a normal's standard deviation (MAD_TO_SIGMA), but never less
# than MIN_SPREAD of the median: alike replicas calibrate within a few percent of
# each other, and with a spread of zero (most peers equal) every other value
# would be called an outlier. Fewer than MIN_PEERS_TO_JUDGE values: none dropped
# (of two, neither is the odd one).
OUTLIER_SPREADS = 3.0
MAD_TO_SIGMA = 1.4826
MIN_SPREAD = 0.05
MIN_PEERS_TO_JUDGE = 3

SOURCE_PEERS = "peers"
SOURCE_OWN = "own calibration"
SOURCE_CEILING = "ceiling"
# The share of its decode ceiling a healthy replica is expected to reach: llama-server
# decodes at 0.46-0.67 of it on this project's 2-core machine, at one and two threads,
# compute-bound there (docs/benchmarks.md, "Decode against the memory-bandwidth ceiling");
# the low end, so a healthy replica is never called slow. A replica is slow below
# slow_ratio x CEILING_SHARE of its ceiling.
CEILING_SHARE = 0.5


@dataclass(frozen=True)
class SpeedPolicy:
    """Decides when a replica is slow: the ratios and the seconds of traffic that set and clear it,
    and how often to read."""

    slow_ratio: float = SLOW_RATIO
    clear_ratio: float = CLEAR_RATIO
    slow_after: float = SLOW_AFTER_SECONDS
    clear_after: float = CLEAR_AFTER_SECONDS
    interval: float = READ_INTERVAL_SECONDS
    idle_max: float = IDLE_MAX_SECONDS
    publish_max: float = PUBLISH_MAX_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.slow_ratio < self.clear_ratio <= 1:
            raise ValueError("speed thresholds need 0 < slow ratio < clear ratio <= 1")


# ---- what a gateway reports ---------------------------------------------------------


@dataclass(frozen=True)
class Rates:
    """Tokens per second; None when nothing was measured."""

    decode: float | None = None
    prefill: float | None = None


@dataclass(frozen=True)
class Totals:
    """A gateway's counters of engine-timed requests since it started."""

    requests: int = 0
    generated_tokens: float = 0.0
    decode_seconds: float = 0.0
    prompt_tokens: float = 0.0
    prefill_seconds: float = 0.0


@dataclass(frozen=True)
class Activity:
    """A gateway's slot requests at the moment it answered (generation, chat,
    embeddings; never listings, probes or its own endpoints): in flight (from
    arrival to end, queued ones included), of them queued for a slot, arrived
    since it started, and seconds since the later of the last arrival and the
    last end (its monotonic clock); `closed`: it refuses them now (asleep)."""

    in_flight: int = 0
    queued: int = 0
    arrived: int = 0
    idle_seconds: float = 0.0
    closed: bool = False


@dataclass(frozen=True)
class Reading:
    """One read of a gateway's /speed document, at the operator's clock."""

    at: float
    calibration: Rates
    totals: Totals
    calibrated_at: float | None = None  # epoch seconds, the gateway's clock
    pod_uid: str = ""
    activity: Activity | None = None  # None: a gateway older than the idle signal


def _rate(tokens: float, seconds: float) -> float | None:
    if not (seconds > 0 and tokens > 0):
        return None
    rate = tokens / seconds
    return rate if rate <= MAX_RATE else None  # inf too (tokens over a denormal)


@dataclass(frozen=True)
class Traffic:
    """What happened between two reads of one gateway."""

    seconds: float  # wall time between the reads
    requests: int
    rates: Rates


def traffic(before: Reading | None, after: Reading) -> Traffic | None:
    """The traffic between two reads of the same gateway process; None for the
    first read, a restarted gateway (its counters went back), or no time."""
    if before is None or after.pod_uid != before.pod_uid:
        return None
    a, b = before.totals, after.totals
    if b.requests < a.requests or b.generated_tokens < a.generated_tokens:
        return None
    seconds = after.at - before.at
    if seconds <= 0:
        return None
    return Traffic(
        seconds=seconds,
        requests=b.requests - a.requests,
        rates=Rates(
            decode=_rate(b.generated_tokens - a.generated_tokens,
                         b.decode_seconds - a.decode_seconds),
            prefill=_rate(b.prompt_tokens - a.prompt_tokens, b.prefill_seconds - a.prefill_seconds),
        ),
    )


# ---- what to expect -------------------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    """The decode rate a replica's node cannot pass and how it was predicted (`localmodel.ceiling`
    makes it: ``predicted: 4.6 GB/s / 4.5 GB per token``)."""

    decode: float
    how: str


@dataclass(frozen=True)
class PeerKey:
    """What makes two replicas comparable. `cpu` is None when the node's CPU
    model is not known: such a replica has no peers."""

    model: str
    engine_image: str
    threads: int
    cpu: tuple[str, str, str] | None


@dataclass(frozen=True)
class Expected:
    """The speed a replica is expected to have, and where it comes from: its peers' or its own
    calibration."""

    decode: float | None
    prefill: float | None
    source: str  # SOURCE_PEERS, SOURCE_OWN, SOURCE_CEILING, or "" when nothing is known
    peers: int = 0
    ceiling: Ceiling | None = None  # the node's decode ceiling, when its bandwidth is known

    @property
    def describe(self) -> str:
        if self.source == SOURCE_PEERS:
            said = f"median calibration of {self.peers} peer replica{'s' * (self.peers != 1)}"
        elif self.source == SOURCE_CEILING and self.ceiling is not None:
            said = f"{CEILING_SHARE:g} of the ceiling"
        else:
            said = self.source or "none: not calibrated"
        if self.ceiling is None:
            return said
        return f"{said}; ceiling {self.ceiling.decode:.3g} tok/s ({self.ceiling.how})"


def with_ceiling(expected: Expected, ceiling: Ceiling | None) -> Expected:
    """``expected`` with the ceiling's floor: CEILING_SHARE of the ceiling where that is higher
    than the calibrations' rate (or they have none)."""
    if ceiling is None:
        return expected
    floor = CEILING_SHARE * ceiling.decode
    if expected.decode is not None and expected.decode >= floor:
        return replace(expected, ceiling=ceiling)
    return replace(expected, decode=floor, source=SOURCE_CEILING, ceiling=ceiling)


def inliers(values: Sequence[float]) -> list[float]:
    """`values` without their outliers (median/MAD, see OUTLIER_SPREADS), in
    their order. The median is always kept, and so is every value of a majority
    that lies within MIN_SPREAD * OUTLIER_SPREADS of it: a minority of lying
    peers cannot move the median of what is kept out of the honest range."""
    if len(values) < MIN_PEERS_TO_JUDGE:
        return list(values)
    middle = statistics.median(values)
    mad = statistics.median(abs(v - middle) for v in values)
    spread = max(MAD_TO_SIGMA * mad, MIN_SPREAD * abs(middle))
    return [v for v in values if abs(v - middle) <= OUTLIER_SPREADS * spread]


def _median(values: Iterable[float | None]) -> float | None:
    known = inliers([v for v in values if v is not None])
    return statistics.median(known) if known else None


def expected_speed(me: str, key: PeerKey, calibrations: Mapping[str, tuple[PeerKey, Rates]],
                   ceiling: Ceiling | None = None) -> Expected:
    """The expected rates of replica `me`, from every replica's (key, calibration):
    the caller passes only replicas it vouches for, besides `me` itself. Outliers
    are dropped from the decode and the prefill rates each (`inliers`); `peers`
    counts the decode rates kept. The decode ceiling of `me`'s node, when known,
    floors the decode rate (`with_ceiling`)."""
    return with_ceiling(_calibrated(me, key, calibrations), ceiling)


def _calibrated(me: str, key: PeerKey, calibrations: Mapping[str, tuple[PeerKey, Rates]]
                ) -> Expected:
    peers = [rates for other, (k, rates) in sorted(calibrations.items())
             if other != me and key.cpu is not None and k == key and rates.decode is not None]
    if peers:
        decodes = inliers([r.decode for r in peers if r.decode is not None])
        return Expected(statistics.median(decodes), _median(r.prefill for r in peers),
                        SOURCE_PEERS, len(decodes))
    own = calibrations.get(me)
    if own is not None and own[1].decode is not None:
        return Expected(own[1].decode, own[1].prefill, SOURCE_OWN)
    return Expected(None, None, "")


# ---- when it is slow --------------------------------------------------------------------


@dataclass(frozen=True)
class SlowState:
    """Keeps whether a replica is slow, the seconds of traffic counting toward a change, and the
    last ratio."""

    slow: bool = False
    below: float = 0.0  # seconds of traffic below slow_ratio (counting toward slow)
    above: float = 0.0  # seconds of traffic at or above clear_ratio (counting toward clear)
    ratio: float | None = None  # the last ratio measured with traffic


def ratio_of(measured: float | None, expected: float | None) -> float | None:
    if measured is None or expected is None or not expected > 0:
        return None
    ratio = measured / expected
    return ratio if math.isfinite(ratio) else None  # a rate over a denormal expectation


def step(state: SlowState, ratio: float | None, seconds: float, policy: SpeedPolicy) -> SlowState:
    """One read's worth of traffic (`seconds` of it, at `ratio` of the expected
    decode rate). No traffic or no expectation: nothing changes."""
    if ratio is None or seconds <= 0:
        return state
    if not state.slow:
        if ratio >= policy.slow_ratio:
            return SlowState(False, 0.0, 0.0, ratio)
        below = state.below + seconds
        if below >= policy.slow_after:
            return SlowState(True, 0.0, 0.0, ratio)
        return SlowState(False, below, 0.0, ratio)
    if ratio < policy.clear_ratio:
        return SlowState(True, 0.0, 0.0, ratio)
    above = state.above + seconds
    if above >= policy.clear_after:
        return SlowState(False, 0.0, 0.0, ratio)
    return SlowState(True, 0.0, above, ratio)


# ---- when to read --------------------------------------------------------------------


@dataclass(frozen=True)
class ReadLog:
    """The last read of one pod (by uid): when, and how many in a row found no
    traffic or failed."""

    at: float
    quiet: int = 0


def next_read(last: ReadLog | None, policy: SpeedPolicy, at_most: float | None = None) -> float:
    """When to read a Ready pod next (operator clock); 0: now (never read: its
    calibration). `at_most`: the longest gap between two reads whatever the
    traffic (a model with spec.idle: `idle_read_every`)."""
    if last is None:
        return 0.0
    gap = policy.interval if last.quiet == 0 else policy.idle_max
    return last.at + (gap if at_most is None else min(gap, at_most))


# A model with spec.idle is read at least this often: its gateways' activity
# is the idle signal (idle/state.py due_to_sleep), and a reading is at most
# this old when the operator decides.
IDLE_READ_MAX_SECONDS = 60.0


def idle_read_every(after_s: float) -> float:
    """The longest gap between two reads of a replica whose model sleeps
    after `after_s` idle seconds: a quarter of it, at most IDLE_READ_MAX_SECONDS."""
    return min(after_s / 4, IDLE_READ_MAX_SECONDS)


def after_read(last: ReadLog | None, at: float, busy: bool) -> ReadLog:
    """The log after a read at `at`: `busy` when it found traffic since the last
    (the first read, at readiness, finds none by definition)."""
    return ReadLog(at, 0 if busy else (last.quiet if last else 0) + 1)


# ---- what to publish ----------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """The numbers of one replica as written to its status."""

    calibration: Rates
    recent: Rates
    expected: Expected
    slow: bool
    measured_at: float


def _moved(old: float | None, new: float | None) -> bool:
    if old is None or new is None:
        return old != new
    return abs(new - old) > PUBLISH_CHANGE * max(abs(old), 1e-9)


def worth_publishing(old: Published | None, new: Published, policy: SpeedPolicy) -> bool:
    if old is None or old.slow != new.slow or old.expected.source != new.expected.source:
        return True
    # A ceiling learnt (the node's bandwidth measured after the replica's calibration) or
    # lost is news even when the expected rate stays its calibration's.
    if (old.expected.ceiling is None) != (new.expected.ceiling is None):
        return True
    if new.measured_at - old.measured_at >= policy.publish_max:
        return True
    pairs = ((old.calibration.decode, new.calibration.decode),
             (old.calibration.prefill, new.calibration.prefill),
             (old.recent.decode, new.recent.decode), (old.recent.prefill, new.recent.prefill),
             (old.expected.decode, new.expected.decode),
             (old.expected.ceiling.decode if old.expected.ceiling else None,
              new.expected.ceiling.decode if new.expected.ceiling else None))
    return any(_moved(a, b) for a, b in pairs)


def publish(old: Published | None, new: Published, policy: SpeedPolicy) -> Published:
    return new if worth_publishing(old, new, policy) else old or new


def with_expected(p: Published, expected: Expected) -> Published:
    return replace(p, expected=expected)
