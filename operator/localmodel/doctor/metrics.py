"""The gateway's Prometheus text, read back into the numbers doctor judges. Pure.

Metric names are the gateway's (`localmodel.gateway.metrics.GatewayMetrics`,
prefix `localmodel.gateway_contract.METRIC_PREFIX`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from localmodel.gateway_contract import METRIC_PREFIX

__all__ = ["GatewayStats", "MetricsError", "gateway_stats", "parse_metrics"]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class MetricsError(ValueError):
    """Text that is not the Prometheus exposition format; names the line."""


def parse_metrics(text: str) -> Samples:
    """(name, labels) -> value for every sample line; comments skipped."""
    samples: Samples = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsError(f"line {number}: not a metric sample: {line[:80]!r}")
        name, labels, value = match.groups()
        try:
            number_value = float(value)
        except ValueError:
            raise MetricsError(f"line {number}: {value!r} is not a number") from None
        pairs = frozenset(_LABEL.findall(labels or ""))
        samples[(name, pairs)] = number_value
    return samples


def _sum(samples: Samples, name: str, **match: str) -> float:
    total = 0.0
    for (sample, labels), value in samples.items():
        if sample != METRIC_PREFIX + name:
            continue
        have = dict(labels)
        if all(have.get(k) == v for k, v in match.items()):
            total += value
    return total


def _has(samples: Samples, name: str) -> bool:
    return any(sample == METRIC_PREFIX + name for sample, _ in samples)


@dataclass(frozen=True)
class GatewayStats:
    """One gateway's numbers as its metrics say them: slots, queues, rejections, cancellations,
    tokens and seconds."""

    slots: int
    slots_busy: int
    queued_foreground: int
    queued_background: int
    rejected_background: int  # 429s: background turned away (no slot free)
    rejected_queue_full: int  # 503s: foreground queue full
    cancellations: int
    generated_tokens: float
    decode_seconds: float
    prompt_tokens: float
    prefill_seconds: float
    slot_busy_seconds: float

    @property
    def decode_tps(self) -> float | None:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def prefill_tps(self) -> float | None:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None


def gateway_stats(samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]) -> GatewayStats:
    s = dict(samples)
    if not _has(s, "slots"):
        raise MetricsError(f"no {METRIC_PREFIX}slots sample: not the localmodel gateway's metrics")

    def whole(value: float) -> int:
        return int(value) if math.isfinite(value) else 0

    return GatewayStats(
        slots=whole(_sum(s, "slots")),
        slots_busy=whole(_sum(s, "slots_busy")),
        queued_foreground=whole(_sum(s, "queued", priority="foreground")),
        queued_background=whole(_sum(s, "queued", priority="background")),
        rejected_background=whole(_sum(s, "requests_total", outcome="rejected_busy")),
        rejected_queue_full=whole(_sum(s, "requests_total", outcome="rejected_queue_full")),
        cancellations=whole(_sum(s, "cancellations_total")),
        generated_tokens=_sum(s, "generated_tokens_total"),
        decode_seconds=_sum(s, "decode_seconds_total"),
        prompt_tokens=_sum(s, "prompt_tokens_total"),
        prefill_seconds=_sum(s, "prefill_seconds_total"),
        slot_busy_seconds=_sum(s, "slot_busy_seconds_total"),
    )
