"""Where tinyserve's answers carry its own account of a generation (the
`TimingReader` of localmodel.gateway_contract.timing). Pure.

Its last chunk (a whole non-stream answer) carries `tiny_ledger`:
`read_tokens` (the prompt's tokens it read), `reused_tokens` (those its prompt
memo held), `wrote_tokens`, and `read_us`, `wrote_us`, `warm_us` in
microseconds; `stop_cause` says why it stopped. It sends no `usage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localmodel.gateway_contract.timing import EngineTiming, count, number, timing_from_usage
from tests.engines.tinyserve import LEDGER_KEY, STOP_KEY

KEYS: tuple[str, ...] = (LEDGER_KEY, STOP_KEY)


def _seconds(value: Any) -> float | None:
    us = number(value)
    return None if us is None else us / 1e6


def timing(answer: Mapping[str, Any], finish_reason: str | None) -> EngineTiming:
    """`tiny_ledger` when present, else OpenAI's `usage` (as every engine reads it)."""
    ledger = answer.get(LEDGER_KEY)
    cause = answer.get(STOP_KEY)
    reason = cause if isinstance(cause, str) else finish_reason
    if not isinstance(ledger, dict):
        usage = answer.get("usage")
        return timing_from_usage(usage if isinstance(usage, dict) else None, reason)
    read, reused = count(ledger.get("read_tokens")), count(ledger.get("reused_tokens"))
    total = None if read is None or reused is None else read + reused
    return EngineTiming(
        prompt_tokens=read,
        prompt_seconds=_seconds(ledger.get("read_us")),
        generated_tokens=count(ledger.get("wrote_tokens")),
        decode_seconds=_seconds(ledger.get("wrote_us")),
        load_seconds=_seconds(ledger.get("warm_us")),
        done_reason=reason,
        prompt_total=total,
        prompt_cached=reused,
        prompt_evaluated=read,
    )


# An answer as tinyserve sends it (the last chunk of a chat stream, server.py)
# and the account it means, for the conformance suite (tests/conformance/).
EXAMPLE: tuple[str, dict[str, Any], EngineTiming] = (
    "/v1/chat/completions",
    {"id": "tiny-1", "object": "chat.completion.chunk", "created": 0, "model": "gemma3:270m",
     "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
     LEDGER_KEY: {"read_tokens": 16, "reused_tokens": 10, "wrote_tokens": 8, "read_us": 4000,
                  "wrote_us": 32000, "warm_us": 1500},
     STOP_KEY: "length"},
    EngineTiming(prompt_tokens=16, prompt_seconds=0.004, generated_tokens=8, decode_seconds=0.032,
                 load_seconds=0.0015, done_reason="length", prompt_total=26, prompt_cached=10,
                 prompt_evaluated=16),
)
