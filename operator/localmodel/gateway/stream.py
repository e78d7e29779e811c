"""Reading the engine's streams: lines, events, errors and the engine's own
account of a generation (`EngineTiming`). Pure.

Upstream always streams (see rewrite.py). Ollama streams NDJSON: one object per
token with `response` (generate) or `message` (chat), then a final object with
`done: true`, `done_reason` and the timing fields (`total_duration`,
`load_duration`, `prompt_eval_count`, `prompt_eval_duration`, `eval_count`,
`eval_duration`, durations in nanoseconds; docs.ollama.com/api/usage). The
OpenAI-compatible routes stream server-sent events (`data: {...}` lines,
`data: [DONE]` last); llama-server adds `timings` (prompt_n, prompt_ms,
predicted_n, predicted_ms) to its last chunk and `usage` when
`stream_options.include_usage` is set (llama.cpp tools/server/server-task.cpp).

Memory is bounded: a line has a limit (`MAX_LINE_BYTES`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LINE_BYTES = 8 * 1024 * 1024


class StreamError(ValueError):
    """The upstream stream broke its format or a limit."""


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
    return None if number is None else int(number)


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


class LineSplitter:
    """Bytes in, complete lines out (without the newline), with a line limit."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buf and data.endswith(b"\n"):
            # The common case (one token, one whole line): no copying.
            return [line.rstrip(b"\r") for line in data[:-1].split(b"\n")]
        self._buf += data
        if b"\n" not in data:
            if len(self._buf) > self._max:
                raise StreamError(f"upstream line longer than {self._max} bytes")
            return []
        *lines, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest)
        if len(self._buf) > self._max:
            raise StreamError(f"upstream line longer than {self._max} bytes")
        return [line.rstrip(b"\r") for line in lines]

    def flush(self) -> bytes:
        rest = bytes(self._buf).rstrip(b"\r")
        self._buf.clear()
        return rest


DONE = object()  # the SSE `[DONE]` sentinel


def sse_data(line: bytes) -> bytes | None:
    """The payload of an SSE `data:` line, else None (comments, event names, blanks).

    Every engine we front sends one `data:` line per event, so a line is an event."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:]
    if payload.startswith(b" "):
        payload = payload[1:]
    return payload


def decode_event(payload: bytes) -> dict[str, Any] | object:
    if payload.strip() == b"[DONE]":
        return DONE
    return _loads(payload)


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StreamError(f"upstream sent invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise StreamError("upstream sent a JSON value that is not an object")
    return value


def decode_ndjson(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    return _loads(line)


def error_message(obj: dict[str, Any]) -> str | None:
    """Both engines report a failure mid-stream as an object with `error`."""
    err = obj.get("error")
    if err is None:
        return None
    if isinstance(err, dict):
        message = err.get("message")
        return str(message) if message is not None else json.dumps(err)
    return str(err)
