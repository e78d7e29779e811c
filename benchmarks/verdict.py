"""The statistics `benchmarks/threads.py` and `benchmarks/pods.py` share: the
order the points are measured in, each point's spread, and the verdict on the
operator's thread count. Pure (values in, values out); tested with tables and
properties in tests/benchmarks/test_verdict.py.

- **Schedule** (`interleaved`): a warm-up first (not counted: it pays the
  weights' cold page cache and the first graph), then every point once per
  round, in the same order each round: A B C A B C ... Drift of the machine
  over the run (other users' load, a warming cache) then falls on every point
  alike instead of on whichever ran first.
- **Spread** (`Spread`): a point's samples are one number per round (the
  median of that round's requests); its spread is their lowest and highest.
  With one sample (a collapsed point measured once) the spread is that value.
- **Verdict** (`verdict`): the operator's median decode over the best median
  among the points whose thread count *differs* from the operator's (a point
  with the same count runs the same command: comparing the operator with it
  measures only noise). At or above BAR (0.95) it is `MET`; below it, if the
  operator's spread reaches the best point's spread (the two ranges overlap),
  the gap is inside what the same point varies by from round to round:
  `INSIDE`; otherwise `BELOW`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

BAR = 0.95  # operator / best of the other thread counts, decode
MET = "operator/best >= 0.95"
INSIDE = "inside the spread"
BELOW = "below"
NO_OTHER = "no other thread count measured"

T = TypeVar("T")


def interleaved(points: Sequence[T], rounds: int, warmup: T | None = None) -> list[tuple[int, T]]:
    """(round, point) in measuring order: the warm-up as round 0, then rounds
    1..`rounds`, each point once per round, in `points`' order."""
    if rounds < 1:
        raise ValueError(f"rounds: at least 1, got {rounds}")
    head = [] if warmup is None else [(0, warmup)]
    return head + [(r, p) for r in range(1, rounds + 1) for p in points]


@dataclass(frozen=True)
class Spread:
    """A point's per-round samples: their median, lowest and highest."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise ValueError("samples: at least one")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    @property
    def relative(self) -> float:
        """(high - low) / median: how much the point moved between rounds."""
        return (self.high - self.low) / self.median if self.median > 0 else 0.0

    def text(self, fmt: str = "{:.2f}") -> str:
        if self.n == 1:
            return f"{fmt.format(self.median)} (1 round)"
        return (f"{fmt.format(self.median)} [{fmt.format(self.low)}-{fmt.format(self.high)}, "
                f"{self.n} rounds, +-{self.relative * 50:.0f}%]")


@dataclass(frozen=True)
class Measured:
    """One point's decode samples (tok/s, one per round); `threads`: the count
    it ran with (None: not known); `cut`: its decode hit the time cap, so its
    rate is an upper bound."""

    label: str
    threads: int | None
    samples: tuple[float, ...]
    cut: bool = False


@dataclass(frozen=True)
class Verdict:
    kind: str  # MET, INSIDE, BELOW or NO_OTHER
    ratio: float | None  # operator's median / best's median
    best: str  # the best other point's label ("" when none)
    operator: Spread | None
    other: Spread | None
    lower_bound: bool = False  # the best was cut at the cap: the ratio is a lower bound

    def text(self) -> str:
        if self.ratio is None or self.operator is None or self.other is None:
            return f"operator / best of the other thread counts: {self.kind}"
        bound = ">" if self.lower_bound else ""
        return (f"operator / best of the other thread counts ({self.best}) decode "
                f"{bound}{self.ratio:.2f}: {self.kind} (operator {self.operator.text()}; "
                f"{self.best} {self.other.text()})")


def verdict(operator: Measured, others: Sequence[Measured]) -> Verdict:
    """The operator's point against the best of `others` whose thread count
    differs from the operator's (points with no samples are left out)."""
    if not operator.samples:
        raise ValueError(f"{operator.label}: no samples")
    own = Spread.of(operator.samples)
    rivals = [m for m in others if m.samples
              and (m.threads is None or m.threads != operator.threads)]
    if not rivals:
        return Verdict(NO_OTHER, None, "", own, None)
    best = max(rivals, key=lambda m: Spread.of(m.samples).median)
    theirs = Spread.of(best.samples)
    if theirs.median <= 0:
        return Verdict(MET, None, best.label, own, theirs)
    ratio = own.median / theirs.median
    if ratio >= BAR:
        kind = MET
    elif own.high >= theirs.low:
        kind = INSIDE
    else:
        kind = BELOW
    return Verdict(kind, ratio, best.label, own, theirs, lower_bound=best.cut)
