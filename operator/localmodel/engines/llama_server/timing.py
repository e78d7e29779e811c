"""Where llama-server's answers carry its own account of a generation (the
`TimingReader` of gateway_contract/timing.py). Pure.

Its OpenAI-compatible routes carry OpenAI's `usage` (in a stream, on the last
chunk when the caller asks with stream_options.include_usage) and add
`timings` (cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms;
milliseconds) to the final answer and to every stream's last chunk (llama.cpp
tools/server/server-task.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from localmodel.gateway_contract.timing import EngineTiming, count, number, timing_from_usage

KEYS: tuple[str, ...] = ("timings",)


def timing(answer: Mapping[str, Any], finish_reason: str | None) -> EngineTiming:
    """`timings` when present, over `usage`'s counts."""
    usage = answer.get("usage")
    base = timing_from_usage(usage if isinstance(usage, dict) else None, finish_reason)
    timings = answer.get("timings")
    if not isinstance(timings, dict) or not timings:
        return base
    prompt_n = count(timings.get("prompt_n"))
    cache_n = count(timings.get("cache_n"))
    predicted_n = count(timings.get("predicted_n"))
    prompt_ms = number(timings.get("prompt_ms"))
    predicted_ms = number(timings.get("predicted_ms"))
    out = replace(
        base,
        prompt_seconds=None if prompt_ms is None else prompt_ms / 1000,
        decode_seconds=None if predicted_ms is None else predicted_ms / 1000,
    )
    if prompt_n is not None and cache_n is not None:
        out = replace(out, prompt_total=prompt_n + cache_n, prompt_cached=cache_n,
                      prompt_evaluated=prompt_n)
    # prompt_n counts the tokens actually evaluated (cache hits excluded),
    # which is what prefill speed must be computed from.
    if prompt_n is not None:
        out = replace(out, prompt_tokens=prompt_n)
    if predicted_n is not None:
        out = replace(out, generated_tokens=predicted_n)
    return out


# An answer as llama-server sends it and the account it means (the last chunk
# of a chat stream, llama.cpp tools/server/server-task.cpp), for the
# conformance suite (tests/conformance/): the route, the chunk, the timing.
EXAMPLE: tuple[str, dict[str, Any], EngineTiming] = (
    "/v1/chat/completions",
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
     "model": "gemma3:270m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
     "timings": {"cache_n": 10, "prompt_n": 16, "prompt_ms": 130.0, "predicted_n": 8,
                 "predicted_ms": 160.0}},
    EngineTiming(prompt_tokens=16, prompt_seconds=0.13, generated_tokens=8, decode_seconds=0.16,
                 done_reason="stop", prompt_total=26, prompt_cached=10, prompt_evaluated=16),
)
