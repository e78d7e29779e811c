"""Prometheus text exposition (format 0.0.4) for the gateway and the operator. Pure.

A dozen counters, gauges and histograms do not need a client library; writing
them here keeps the hot path to a dict update and the package free of another
dependency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

Labels = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


@dataclass
class Counter:
    """Keeps a counter's values by label values; they only go up."""

    name: str
    help: str
    labels: Sequence[str] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    kind: str = "counter"

    def inc(self, amount: float = 1.0, labels: Labels = ()) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def samples(self) -> Iterable[str]:
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_label_text(self.labels, labels)} {_format_value(value)}"


@dataclass
class Gauge:
    """A gauge whose value is read at scrape time from `read`."""

    name: str
    help: str
    read: Callable[[], dict[Labels, float]]
    labels: Sequence[str] = ()
    kind: str = "gauge"

    def samples(self) -> Iterable[str]:
        for labels, value in sorted(self.read().items()):
            yield f"{self.name}{_label_text(self.labels, labels)} {_format_value(value)}"


@dataclass
class _Series:
    """Keeps one histogram series: counts per bucket, total and count."""

    counts: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class Histogram:
    """Keeps a histogram's series by label values, over sorted buckets."""

    name: str
    help: str
    buckets: Sequence[float]
    labels: Sequence[str] = ()
    series: dict[Labels, _Series] = field(default_factory=dict)
    kind: str = "histogram"

    def __post_init__(self) -> None:
        if list(self.buckets) != sorted(self.buckets):
            raise ValueError("histogram buckets must be sorted")

    def observe(self, value: float, labels: Labels = ()) -> None:
        series = self.series.get(labels)
        if series is None:
            series = _Series(counts=[0] * len(self.buckets))
            self.series[labels] = series
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                series.counts[i] += 1
                break
        series.total += value
        series.count += 1

    def samples(self) -> Iterable[str]:
        for labels, series in sorted(self.series.items()):
            running = 0
            for bound, n in zip(self.buckets, series.counts, strict=True):
                running += n
                le = f'le="{_format_value(bound)}"'
                yield f"{self.name}_bucket{_label_text(self.labels, labels, le)} {running}"
            inf = 'le="+Inf"'
            yield f"{self.name}_bucket{_label_text(self.labels, labels, inf)} {series.count}"
            yield f"{self.name}_sum{_label_text(self.labels, labels)} {_format_value(series.total)}"
            yield f"{self.name}_count{_label_text(self.labels, labels)} {series.count}"


Metric = Counter | Gauge | Histogram


def render(metrics: Iterable[Metric]) -> str:
    lines: list[str] = []
    for metric in metrics:
        lines.append(f"# HELP {metric.name} {metric.help}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        lines.extend(metric.samples())
    return "\n".join(lines) + "\n"


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RATE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
