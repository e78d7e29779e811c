"""Reading the engine's streams: lines, events and errors. Pure. (The engine's
own account of a generation, `EngineTiming`, is read by the engine's own
reader, engines/<name>/timing.py, over gateway_contract/timing.py, which the
router shares.)

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
from typing import Any

MAX_LINE_BYTES = 8 * 1024 * 1024


class StreamError(ValueError):
    """The upstream stream broke its format or a limit."""


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
