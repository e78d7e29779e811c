"""Where Ollama's answers carry its own account of a generation (the
`TimingReader` of gateway_contract/timing.py). Pure.

The final object of its API's routes (`done: true`: the last line of a
stream, the whole non-stream answer) carries `prompt_eval_count`,
`prompt_eval_cached_count`, `prompt_eval_duration`, `eval_count`,
`eval_duration`, `load_duration` and `done_reason` (durations in
nanoseconds; docs.ollama.com/api/usage). Its OpenAI-compatible routes carry
OpenAI's `usage` only (counts, no durations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localmodel.gateway_contract.timing import (
    EngineTiming,
    count,
    difference,
    number,
    timing_from_usage,
)

# The fields that say an answer is Ollama's account (the router's reading of
# an answer's tail looks for them).
KEYS: tuple[str, ...] = ("prompt_eval_count", "eval_count")


def timing(answer: Mapping[str, Any], finish_reason: str | None) -> EngineTiming:
    """Ollama's final object, or `usage` on its OpenAI-compatible routes."""
    usage = answer.get("usage")
    if isinstance(usage, dict):
        return timing_from_usage(usage, finish_reason)
    return final_timing(answer, finish_reason)


def final_timing(final: Mapping[str, Any], finish_reason: str | None = None) -> EngineTiming:
    """The final object of Ollama's API routes (the reason: its `done_reason`)."""

    def seconds(key: str) -> float | None:
        ns = number(final.get(key))
        return None if ns is None else ns / 1e9

    reason = final.get("done_reason", finish_reason)
    # prompt_eval_count counts the whole prompt, cached tokens included;
    # prompt_eval_cached_count (when present) the cached ones.
    total = count(final.get("prompt_eval_count"))
    cached = count(final.get("prompt_eval_cached_count"))
    evaluated = difference(total, cached)
    return EngineTiming(
        # The tokens evaluated in prompt_eval_duration, where Ollama says.
        prompt_tokens=evaluated if evaluated is not None else total,
        prompt_seconds=seconds("prompt_eval_duration"),
        generated_tokens=count(final.get("eval_count")),
        decode_seconds=seconds("eval_duration"),
        load_seconds=seconds("load_duration"),
        done_reason=reason if isinstance(reason, str) else None,
        prompt_total=total,
        prompt_cached=cached,
        prompt_evaluated=evaluated,
    )


# An answer as Ollama sends it and the account it means (docs.ollama.com/api/usage:
# the final object of a stream), for the conformance suite (tests/conformance/):
# the route, the final object, the timing.
EXAMPLE: tuple[str, dict[str, Any], EngineTiming] = (
    "/api/generate",
    {"model": "gemma3:270m", "created_at": "2026-01-01T00:00:00Z", "response": "",
     "done": True, "done_reason": "stop", "total_duration": 310_000_000,
     "load_duration": 12_000_000, "prompt_eval_count": 26, "prompt_eval_cached_count": 10,
     "prompt_eval_duration": 130_000_000, "eval_count": 8, "eval_duration": 160_000_000},
    EngineTiming(prompt_tokens=16, prompt_seconds=0.13, generated_tokens=8, decode_seconds=0.16,
                 load_seconds=0.012, done_reason="stop", prompt_total=26, prompt_cached=10,
                 prompt_evaluated=16),
)
