"""The engine's own account of one generation (`EngineTiming`), in one home
for the gateway (metrics, ledger, speed) and the router (how many tokens a
replica now holds of a session), and how an engine's package says where its
answers carry it (`TimingReader`). Pure; names no engine.

Each engine reads its own fields in its package (engines/<name>/timing.py,
found beside its facts by localmodel.engines.timings); what is shared is
here: the numbers' checks and OpenAI's `usage` (prompt_tokens,
completion_tokens, prompt_tokens_details.cached_tokens;
platform.openai.com/docs/api-reference/chat/object), which every
OpenAI-compatible route carries whatever engine answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


def number(value: Any) -> float | None:
    """A JSON number as a float (None: not a number; a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def count(value: Any) -> int | None:
    """A JSON number as a whole count (None: not a finite number)."""
    number_ = number(value)
    return None if number_ is None or not math.isfinite(number_) else int(number_)


def difference(total: int | None, part: int | None) -> int | None:
    """What is left of `total` without `part` (never below 0); None when either is unknown."""
    return None if total is None or part is None else max(0, total - part)


def timing_from_usage(usage: Mapping[str, Any] | None, finish_reason: str | None) -> EngineTiming:
    """OpenAI's `usage` counts (no durations), and the answer's finish_reason."""
    prompt = generated = cached = None
    if usage:
        prompt = count(usage.get("prompt_tokens"))
        generated = count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = count(details.get("cached_tokens"))
    return EngineTiming(
        prompt_tokens=prompt,
        generated_tokens=generated,
        done_reason=finish_reason,
        prompt_total=prompt,
        prompt_cached=cached,
        prompt_evaluated=difference(prompt, cached),
    )


class TimingReader(Protocol):
    """How one engine's answers carry its own account of a generation: the
    module engines/<name>/timing.py of each engine package (mypy checks each
    against this; localmodel.engines.timings finds them)."""

    # The top-level fields of an answer, or of the stream chunk that ends it,
    # that carry the engine's account (beside OpenAI's `usage`). The gateway
    # keeps the last of each from an OpenAI-compatible stream and its watcher
    # reads the lines that name one; the router reads an answer's tail by them.
    KEYS: tuple[str, ...]

    def timing(self, answer: Mapping[str, Any], finish_reason: str | None) -> EngineTiming:
        """The engine's account in `answer`: its final object on the
        /api/generate and /api/chat routes (`done: true`: the last line of a
        stream, the whole non-stream answer),
        or on the OpenAI-compatible routes `usage` and KEYS gathered from its
        chunks (the last of each) with the choices' `finish_reason`."""
        ...


def held_tokens(doc: Any, readers: Iterable[TimingReader]) -> int | None:
    """The tokens the answering engine now holds of the conversation (its whole
    prompt plus what it generated), from one answer document or its last
    chunk, read by the first of `readers` whose KEYS the document carries
    (none: OpenAI's `usage` alone); None when the document says neither, or
    says something past any context (the answer crosses a trust boundary)."""
    if not isinstance(doc, dict):
        return None
    reader = next((r for r in readers if any(key in doc for key in r.KEYS)), None)
    if reader is not None:
        timing = reader.timing(doc, None)
    elif isinstance(doc.get("usage"), dict):
        timing = timing_from_usage(doc["usage"], None)
    else:
        return None
    if timing.prompt_total is None or timing.generated_tokens is None:
        return None
    held = timing.prompt_total + timing.generated_tokens
    if min(timing.prompt_total, timing.generated_tokens) < 0 or held > MAX_HELD_TOKENS:
        return None
    return held
