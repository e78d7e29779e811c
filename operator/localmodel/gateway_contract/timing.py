"""The engine's own account of one generation (`EngineTiming`), read from its
last stream event, in one home for the gateway (metrics, ledger, speed) and
the router (how many tokens a replica now holds of a session). Pure.

Ollama's final object carries `prompt_eval_count`, `prompt_eval_cached_count`,
`prompt_eval_duration`, `eval_count`, `eval_duration`, `load_duration`
(durations in nanoseconds; docs.ollama.com/api/usage). The OpenAI-compatible
routes carry `usage` (prompt_tokens, completion_tokens,
prompt_tokens_details.cached_tokens) and llama-server adds `timings`
(cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms) to its last chunk
(llama.cpp tools/server/server-task.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_HELD_TOKENS = 10_000_000  # a count past any context: a bad answer, ignored


@dataclass(frozen=True)
class EngineTiming:
    """The engine's own account of one generation."""

    prompt_tokens: int | None = None
    prompt_seconds: float | None = None
    generated_tokens: int | None = None
    decode_seconds: float | None = None
    load_seconds: float | None = None
    done_reason: str | None = None
    # The prompt as the ledger accounts it (docs/engine-facts.md, Prompt cache
    # accounting): all of its tokens, those reused from the engine's prompt
    # cache, those evaluated. None: the engine did not say.
    prompt_total: int | None = None
    prompt_cached: int | None = None
    prompt_evaluated: int | None = None

    @property
    def prefill_tokens_per_second(self) -> float | None:
        return _rate(self.prompt_tokens, self.prompt_seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        return _rate(self.generated_tokens, self.decode_seconds)


def _rate(tokens: int | None, seconds: float | None) -> float | None:
    if tokens is None or seconds is None or seconds <= 0:
        return None
    return tokens / seconds


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    number = _num(value)
    return None if number is None or not math.isfinite(number) else int(number)


def timing_from_ollama(final: dict[str, Any]) -> EngineTiming:
    def seconds(key: str) -> float | None:
        ns = _num(final.get(key))
        return None if ns is None else ns / 1e9

    reason = final.get("done_reason")
    # prompt_eval_count counts the whole prompt, cached tokens included;
    # prompt_eval_cached_count (when present) the cached ones.
    total = _count(final.get("prompt_eval_count"))
    cached = _count(final.get("prompt_eval_cached_count"))
    evaluated = _difference(total, cached)
    return EngineTiming(
        # The tokens evaluated in prompt_eval_duration, where Ollama says.
        prompt_tokens=evaluated if evaluated is not None else total,
        prompt_seconds=seconds("prompt_eval_duration"),
        generated_tokens=_count(final.get("eval_count")),
        decode_seconds=seconds("eval_duration"),
        load_seconds=seconds("load_duration"),
        done_reason=reason if isinstance(reason, str) else None,
        prompt_total=total,
        prompt_cached=cached,
        prompt_evaluated=evaluated,
    )


def _difference(total: int | None, part: int | None) -> int | None:
    return None if total is None or part is None else max(0, total - part)


def timing_from_openai(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, finish_reason: str | None
) -> EngineTiming:
    """llama-server's `timings` (milliseconds) when present, else `usage` counts."""
    prompt_tokens = generated = None
    prompt_s = decode_s = None
    total = cached = evaluated = None
    if usage:
        prompt_tokens = total = _count(usage.get("prompt_tokens"))
        generated = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = _count(details.get("cached_tokens"))
        evaluated = _difference(total, cached)
    if timings:
        prompt_n = _count(timings.get("prompt_n"))
        cache_n = _count(timings.get("cache_n"))
        if prompt_n is not None and cache_n is not None:
            total, cached, evaluated = prompt_n + cache_n, cache_n, prompt_n
        predicted_n = _count(timings.get("predicted_n"))
        prompt_ms = _num(timings.get("prompt_ms"))
        predicted_ms = _num(timings.get("predicted_ms"))
        # prompt_n counts the tokens actually evaluated (cache hits excluded),
        # which is what prefill speed must be computed from.
        if prompt_n is not None:
            prompt_tokens = prompt_n
        if predicted_n is not None:
            generated = predicted_n
        prompt_s = None if prompt_ms is None else prompt_ms / 1000
        decode_s = None if predicted_ms is None else predicted_ms / 1000
    return EngineTiming(
        prompt_tokens=prompt_tokens,
        prompt_seconds=prompt_s,
        generated_tokens=generated,
        decode_seconds=decode_s,
        done_reason=finish_reason,
        prompt_total=total,
        prompt_cached=cached,
        prompt_evaluated=evaluated,
    )


def held_tokens(doc: Any) -> int | None:
    """The tokens the answering engine now holds of the conversation (its whole
    prompt plus what it generated), from one answer document or its last
    chunk; None when the document says neither, or says something past any
    context (the answer crosses a trust boundary)."""
    if not isinstance(doc, dict):
        return None
    usage, timings = doc.get("usage"), doc.get("timings")
    if isinstance(usage, dict) or isinstance(timings, dict):
        timing = timing_from_openai(usage if isinstance(usage, dict) else None,
                                    timings if isinstance(timings, dict) else None, None)
    elif "prompt_eval_count" in doc or "eval_count" in doc:
        timing = timing_from_ollama(doc)
    else:
        return None
    if timing.prompt_total is None or timing.generated_tokens is None:
        return None
    held = timing.prompt_total + timing.generated_tokens
    if min(timing.prompt_total, timing.generated_tokens) < 0 or held > MAX_HELD_TOKENS:
        return None
    return held
