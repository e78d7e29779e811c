"""More models than nodes (issue 44), simulated: the real pure idle core
(`localmodel.idle`: `due_to_sleep`, `advance`, `choose_yields`) and the real
planner (a long-lived `Planner`, with `prefer`) driven by a virtual clock over
a synthetic trace, side by side with static placement in the same run.

Run: python benchmarks/idle.py [--quick] [--kwok] [--models N] [--nodes M]
       [--minutes T] [--rate R] [--wake-s W] [--after-s A] [--seed S] [--json]
  full:  N=12 models on M=4 nodes, one virtual day (24 h), after 30 min
  quick: N=6, M=3, 10 virtual minutes, after 60 s (seconds of wall time;
         CI runs it, tests/benchmarks/test_quick_modes.py)
  --kwok: the same trace's shape in wall time on the kwok control plane with
         the real operator and router (benchmarks/idle_kwok.py): full N=8,
         M=3, 10 minutes; quick N=4, M=2, 120 s, about 2.5 minutes in all (CI
         runs it, tests/e2e/test_idle_bench_quick.py)

The trace (seeded, the same for both modes): arrivals are Poisson with a
day/night factor (a cosine over one virtual day, or over the whole trace
when it is shorter: the night at its start and end is a fifth of the day's
peak), spread over the models by Zipf(1.1) popularity (ranks dealt at
random, so which models static placement runs is not chosen by popularity);
each request lasts a log-normal time (median 8 s). Every model asks for 4 of
a node's 8 CPUs, exclusively: one model per node.

Static placement: no `spec.idle`; the planner places M models and the other
N - M stay Unplaced; their requests are refused at once.

Idle (every model with `idle: {after, priority 0, release: OnDemand}`, the
router holding up to 16 requests per model for up to 120 s): every
`--tick-s` the operator's pass reads each replica's activity, puts a model
to sleep when `due_to_sleep` (resident: it keeps its node), places the
waking models (their home node preferred) with the planner, and for those
left unplaced asks `choose_yields` whom to ask; the ask reaches the
candidate's gateway `--call-s` later, which closes only if it is still
quiet then (200) or refuses (409), as the real gateway judges on its own
counts. A closed model's pod is deleted and its node given to the waker.
A wake takes a log-normal time around `--wake-s` (default 19.0 s: a deleted
llama-server pod Ready again, docs/test-cluster.md, 2026-12-01; Ollama's
was 27.9 s). A request for a released model is held until its model is
Ready (its held time counted), or refused when its deadline passes or the
model's hold is full. A busy eviction (a node taken from a model with a
request in flight) is counted where a node is taken: it must be 0.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from localmodel.facts import NodeFacts
from localmodel.idle import (
    AWAKE,
    Candidate,
    Event,
    IdlePolicy,
    Phase,
    Reading,
    State,
    Waker,
    advance,
    choose_yields,
    due_to_sleep,
)
from localmodel.planner import CpuRequest, ModelDemand, Planner

GiB = 1 << 30
EPOCH = datetime(2026, 12, 7, tzinfo=UTC)
HOLD_PER_MODEL = 16
HOLD_S = 120.0
GRACE_S = 30.0
RESERVE_S = 120.0


@dataclass(frozen=True)
class Settings:
    """One run's shape."""

    models: int
    nodes: int
    seconds: float
    rate: float  # requests per second at the day's peak, over all models
    wake_s: float
    after_s: float
    tick_s: float = 2.0
    call_s: float = 0.2  # from the operator's decision to the gateway's answer
    seed: int = 44


@dataclass(frozen=True, order=True)
class Request:
    at: float
    model: str
    length: float


def trace(s: Settings) -> list[Request]:
    """Poisson arrivals (thinned by the day/night factor), Zipf(1.1) models,
    log-normal lengths; seeded."""
    rnd = random.Random(s.seed)
    ranks = list(range(s.models))
    rnd.shuffle(ranks)
    weights = [1 / (r + 1) ** 1.1 for r in ranks]
    keys = [f"ai/m{i}" for i in range(s.models)]
    day = min(86400.0, s.seconds)
    out: list[Request] = []
    t = 0.0
    while True:
        t += rnd.expovariate(s.rate)
        if t >= s.seconds:
            return out
        factor = 0.6 - 0.4 * math.cos(2 * math.pi * t / day)  # 0.2 at night, 1 at noon
        if rnd.random() < factor:
            model = rnd.choices(keys, weights)[0]
            out.append(Request(t, model, rnd.lognormvariate(math.log(8.0), 0.8)))


@dataclass
class Model:
    """One model as the gateways, the router and the operator see it."""

    key: str
    demand: ModelDemand
    phase: Phase = AWAKE
    node: str | None = None  # where its pod is (scheduled)
    ready_at: float | None = None  # when that pod is Ready (None: not yet placed)
    ends: list[float] = field(default_factory=list)  # in-flight requests' ends (a heap)
    last: float = 0.0  # the later of the last arrival and the last end
    held: deque[float] = field(default_factory=deque)  # held requests' arrivals
    held_lengths: deque[float] = field(default_factory=deque)
    home: str | None = None  # where its claim is
    woke_at: float | None = None
    reserved: tuple[str, float] | None = None  # (node, until) yielded to it

    def ready(self, now: float) -> bool:
        return self.node is not None and self.ready_at is not None and self.ready_at <= now

    def reading(self, now: float) -> Reading:
        return Reading(len(self.ends), 0, 0.0 if self.ends else now - self.last)


@dataclass
class Tally:
    """What a run reports."""

    served: int = 0
    refused: int = 0
    expired: int = 0
    full: int = 0
    wakes_home: int = 0
    wakes_elsewhere: int = 0
    yields: int = 0
    refused_yields: int = 0
    busy_evictions: int = 0
    held_s: list[float] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        held = sorted(self.held_s)
        return {"served": self.served, "refused": self.refused, "expired": self.expired,
                "full": self.full, "wakes": self.wakes_home + self.wakes_elsewhere,
                "wakes_home": self.wakes_home, "wakes_elsewhere": self.wakes_elsewhere,
                "held": len(held), "held_p50_s": _pct(held, 50), "held_p99_s": _pct(held, 99),
                "yields": self.yields, "refused_yields": self.refused_yields,
                "busy_evictions": self.busy_evictions}


def _pct(values: list[float], p: int) -> float:
    if not values:
        return 0.0
    return round(values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))], 1)


class Cluster:
    """M nodes, N models, the planner; `idle` says whether the models sleep."""

    def __init__(self, s: Settings, idle: bool) -> None:
        self.s, self.idle = s, idle
        self.nodes = [NodeFacts(name=f"node-{i}", allocatable_cpu_milli=8000,
                                allocatable_memory_bytes=32 * GiB) for i in range(s.nodes)]
        self.by_name = {n.name: n for n in self.nodes}
        self.models = {f"ai/m{i}": Model(f"ai/m{i}", ModelDemand(f"ai/m{i}", 1, CpuRequest(4),
                                                                  8 * GiB))
                       for i in range(s.models)}
        self.policy = IdlePolicy(after_s=s.after_s)
        self.planner = Planner()
        self.tally = Tally()
        self.asks: list[tuple[float, str, str, str]] = []  # (at, candidate, node, waker)
        self.rnd = random.Random(s.seed + 1)
        self.place(0.0)
        for m in self.models.values():  # the first pods start with the cluster
            if m.node is not None:
                m.ready_at = 0.0
        if idle:  # the rest begin asleep, released: their first request wakes them
            for m in self.models.values():
                if m.node is None:
                    m.phase = Phase(State.ASLEEP, resident=False)

    # ------------------------------------------------------------ the gateways

    def settle(self, now: float) -> None:
        """Bring every model up to ``now``: ended requests, wakes done (their
        held requests relayed), deadlines passed, yield calls answered."""
        while self.asks and self.asks[0][0] <= now:
            at, candidate, node, waker = heapq.heappop(self.asks)
            self.settle_models(at)
            self.answer_yield(at, candidate, node, waker)
        self.settle_models(now)

    def settle_models(self, now: float) -> None:
        for m in self.models.values():
            while m.ends and m.ends[0] <= now:
                m.last = max(m.last, heapq.heappop(m.ends))
            if m.phase.state is State.WAKING and m.ready(now):
                assert m.ready_at is not None
                self.woke(m, m.ready_at)
            while m.held and m.held[0] + HOLD_S <= now:
                m.held.popleft()
                m.held_lengths.popleft()
                self.tally.expired += 1
                self.tally.refused += 1

    def woke(self, m: Model, at: float) -> None:
        """A waking model's pod is Ready: its held requests go, in order."""
        m.phase = advance(m.phase, Event.READY, at)
        m.woke_at, m.reserved = at, None
        while m.held:
            arrived, length = m.held.popleft(), m.held_lengths.popleft()
            if arrived + HOLD_S <= at:
                self.tally.expired += 1
                self.tally.refused += 1
                continue
            self.tally.held_s.append(at - arrived)
            self.serve(m, at, length)

    def serve(self, m: Model, at: float, length: float) -> None:
        heapq.heappush(m.ends, at + length)
        m.last = max(m.last, at)
        self.tally.served += 1

    def arrive(self, r: Request) -> None:
        m = self.models[r.model]
        if m.ready(r.at) and (m.phase.state is not State.ASLEEP or m.phase.resident):
            if m.phase.state is State.ASLEEP:  # a resident sleeper serves at once
                m.phase = advance(m.phase, Event.ACTIVE, r.at)
            self.serve(m, r.at, r.length)
        elif not self.idle:
            self.tally.refused += 1  # Unplaced: the router answers 503 at once
        elif len(m.held) >= HOLD_PER_MODEL:
            self.tally.full += 1
            self.tally.refused += 1
        else:
            m.held.append(r.at)
            m.held_lengths.append(r.length)
            m.phase = advance(m.phase, Event.WANTED, r.at)

    def answer_yield(self, at: float, candidate: str, node: str, waker: str) -> None:
        """The candidate's gateway judges on its own counts, now (200 or 409)."""
        v, w = self.models[candidate], self.models[waker]
        if w.phase.state is not State.WAKING or w.node is not None:
            return  # nothing waits for the node any more: no call
        if v.ends or v.held or at - v.last < GRACE_S or v.node != node:
            self.tally.refused_yields += 1
            return
        self.release(v, at)
        self.tally.yields += 1
        w.reserved = (node, at + RESERVE_S)

    def release(self, m: Model, at: float) -> None:
        """The one place a node is taken from a model."""
        if m.ends:
            self.tally.busy_evictions += 1
        m.node, m.ready_at = None, None
        m.phase = advance(m.phase, Event.RELEASED, at)

    # ------------------------------------------------------------ the operator

    def operator_pass(self, now: float) -> None:
        if self.idle:
            self.sleep(now)
            for m in self.models.values():
                if m.phase.state is State.WAKING and not m.held and m.node is None:
                    m.phase, m.reserved = advance(m.phase, Event.UNWANTED, now), None
        self.place(now)
        if self.idle:
            self.ask_yields(now)

    def sleep(self, now: float) -> None:
        clock = EPOCH + timedelta(seconds=now)
        for m in self.models.values():
            if m.phase.state is State.AWAKE and m.ready(now) and due_to_sleep(
                    self.policy, [m.reading(now)], len(m.held), clock):
                m.phase = advance(m.phase, Event.SLEPT, now)

    def demands(self, now: float) -> list[ModelDemand]:
        """Every model that holds a node or wants one: a released sleeper has
        none; a waker prefers its reserved node, else its home; the other
        wakers avoid a node reserved for one."""
        reserved = {m.key: m.reserved[0] for m in self.models.values()
                    if m.reserved is not None and m.reserved[1] > now}
        out = []
        for m in self.models.values():
            if m.phase.state is State.ASLEEP and not m.phase.resident:
                continue
            d = m.demand
            if m.node is None and self.idle:
                prefer = reserved.get(m.key) or m.home
                avoid = frozenset(n for k, n in reserved.items() if k != m.key)
                d = replace(d, prefer=(prefer,), avoid=avoid)
            out.append(d)
        return out

    def place(self, now: float) -> None:
        current = {m.key: (m.node,) for m in self.models.values() if m.node is not None}
        plan = self.planner.plan(self.demands(now), self.nodes, current, {})
        for a in plan.placements:
            m = self.models[a.model]
            if m.node is None:  # a new pod: Ready after its wake time
                m.node = a.node
                m.ready_at = now + self.rnd.lognormvariate(math.log(self.s.wake_s), 0.3)
                if m.phase.state is State.WAKING:  # (a first pod's claim is new anyway)
                    where = m.home in (None, a.node)
                    self.tally.wakes_home += where
                    self.tally.wakes_elsewhere += not where
                m.home = a.node
        self.plan = plan

    def ask_yields(self, now: float) -> None:
        wakers = [Waker(d, self.policy, frozenset({m.home} if m.home else ()))
                  for m in self.models.values() if m.phase.state is State.WAKING and m.node is None
                  for d in [m.demand]]
        if not wakers:
            return
        candidates = [Candidate(m.key, self.policy, (m.reading(now),), len(m.held),
                                None if m.woke_at is None else now - m.woke_at)
                      for m in self.models.values() if m.ready(now)]
        asks = choose_yields(wakers, candidates, self.plan, self.by_name, {},
                             {m.key: m.demand for m in self.models.values()},
                             now=EPOCH + timedelta(seconds=now), grace_s=GRACE_S)
        for ask in asks:
            heapq.heappush(self.asks, (now + self.s.call_s, ask.model, ask.node, ask.for_))


def run(s: Settings, requests: list[Request], idle: bool) -> dict[str, Any]:
    """One mode over the trace: arrivals and the operator's passes in time order."""
    cluster = Cluster(s, idle)
    passes = [t * s.tick_s for t in range(1, int(s.seconds / s.tick_s) + 1)]
    events = sorted([(r.at, 1, r) for r in requests] + [(t, 0, None) for t in passes],
                    key=lambda e: (e[0], e[1]))
    for at, _, request in events:
        cluster.settle(at)
        if request is None:
            cluster.operator_pass(at)
        else:
            cluster.arrive(request)
    cluster.settle(s.seconds + HOLD_S)  # what is still held expires or is relayed
    return {"requests": len(requests), **cluster.tally.report()}


ROWS = [("requests", "requests"), ("served", "served"), ("refused", "refused"),
        ("  expired while held", "expired"), ("  hold full", "full"), ("wakes", "wakes"),
        ("  on the home node", "wakes_home"), ("  elsewhere", "wakes_elsewhere"),
        ("held requests", "held"), ("held p50 (s)", "held_p50_s"),
        ("held p99 (s)", "held_p99_s"), ("yields (200 closed)", "yields"),
        ("yields refused (409)", "refused_yields"), ("busy evictions", "busy_evictions")]


def kwok(s: Settings, requests: list[Request]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trace on the kwok control plane (benchmarks/idle_kwok.py): static, idle."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.idle_kwok import Call, run_kwok

    calls = [Call(r.at, int(r.model.rsplit("m", 1)[1])) for r in requests]
    sides = run_kwok(s.models, s.nodes, calls)
    for side in sides.values():
        held = side.pop("held_s")
        side.update(held=len(held), held_p50_s=_pct(held, 50), held_p99_s=_pct(held, 99))
    return sides["static"], sides["idle"]


def settings(args: argparse.Namespace) -> Settings:
    """The run's shape: the flags over the mode's defaults."""
    quick = args.quick
    if args.kwok:
        return Settings(models=args.models or (4 if quick else 8),
                        nodes=args.nodes or (2 if quick else 3),
                        seconds=60 * args.minutes if args.minutes else (120.0 if quick else 600.0),
                        rate=args.rate or 0.5, wake_s=0.0, after_s=60.0, seed=args.seed)
    return Settings(models=args.models or (6 if quick else 12),
                    nodes=args.nodes or (3 if quick else 4),
                    seconds=60 * (args.minutes or (10 if quick else 24 * 60)),
                    rate=args.rate or (0.1 if quick else 0.02), wake_s=args.wake_s,
                    after_s=args.after_s or (60.0 if quick else 1800.0), seed=args.seed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N=6, M=3, 10 virtual minutes")
    parser.add_argument("--kwok", action="store_true",
                        help="on the kwok control plane, in wall time (idle_kwok.py)")
    parser.add_argument("--models", type=int)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--minutes", type=float)
    parser.add_argument("--rate", type=float, help="requests/s at the day's peak (all models)")
    parser.add_argument("--wake-s", type=float, default=19.0, help="median wake (pod -> Ready)")
    parser.add_argument("--after-s", type=float)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    quick = args.quick
    s = settings(args)
    if s.nodes >= s.models:
        parser.error("more models than nodes, please: --models > --nodes")
    requests = trace(s)
    if args.kwok:
        static, idle = kwok(s, requests)
        print(f"{s.models} models on {s.nodes} kwok nodes a side, {s.seconds:.0f} s of wall "
              f"time, after 1m of the gateways' time, seed {s.seed}")
    else:
        static, idle = run(s, requests, idle=False), run(s, requests, idle=True)
        print(f"{s.models} models on {s.nodes} nodes, {s.seconds / 60:.0f} virtual minutes, "
              f"after {s.after_s:.0f} s, wake ~{s.wake_s:.0f} s, seed {s.seed}")
    print(f"{'':24}{'static':>10}{'idle':>10}")
    for label, key in ROWS:
        print(f"{label:24}{static[key]:>10}{idle[key]:>10}")
    if args.kwok:  # refused by the router for another reason (a model not placed, ...)
        print(f"{'  other':24}{static['other_refused']:>10}{idle['other_refused']:>10}")
    if args.json:
        print(json.dumps({"quick": quick, "kwok": args.kwok, "models": s.models, "nodes": s.nodes,
                          "seconds": s.seconds, "static": static, "idle": idle}))
    return 0 if idle["busy_evictions"] == 0 and static["busy_evictions"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
