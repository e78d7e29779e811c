"""Reading the engine's streams and assembling one response from them. Pure.

Upstream always streams (see rewrite.py). Ollama streams NDJSON: one object per
token with `response` (generate) or `message` (chat), then a final object with
`done: true`, `done_reason` and the timing fields (`total_duration`,
`load_duration`, `prompt_eval_count`, `prompt_eval_duration`, `eval_count`,
`eval_duration`, durations in nanoseconds; docs.ollama.com/api/usage). The
OpenAI-compatible routes stream server-sent events (`data: {...}` lines,
`data: [DONE]` last); llama-server adds `timings` (prompt_n, prompt_ms,
predicted_n, predicted_ms) to its last chunk and `usage` when
`stream_options.include_usage` is set (llama.cpp tools/server/server-task.cpp).

A non-streaming caller gets the object the engine would have sent it. Memory
is bounded: lines and the assembled text have limits, and token chunks are
kept as text pieces only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from localmodel.gateway.routes import Kind

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


class _Text:
    """Text pieces, paid for from a shared budget (the bound on an assembled response)."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def add(self, budget: _Budget, piece: Any) -> None:
        if isinstance(piece, str) and piece and budget.take(len(piece)):
            self.pieces.append(piece)

    def text(self) -> str:
        return "".join(self.pieces)


class _Budget:
    """What an assembler may keep. With `keep` false (a watcher of a relayed
    stream) it keeps no content at all, only the final object's facts."""

    def __init__(self, limit: int, keep: bool = True) -> None:
        self.limit = limit
        self.keep = keep
        self.used = 0

    def take(self, n: int) -> bool:
        """Pay for n characters; False when content is not kept."""
        if not self.keep:
            return False
        self.used += n
        if self.used > self.limit:
            raise StreamError(f"assembled response exceeds {self.limit} characters")
        return True


class _Assembler:
    """What both stream formats' assemblers share: the route, the budget, the
    error, and whether the stream is over (`finished`: nothing more to read)."""

    KINDS: tuple[Kind, ...] = ()

    def __init__(self, kind: Kind, limit: int, *, keep_text: bool = True) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"not a {type(self).__name__} route: {kind}")
        self.kind = kind
        self._budget = _Budget(limit, keep_text)
        self.error: str | None = None

    @property
    def final_seen(self) -> bool:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        return self.final_seen or self.error is not None


class OllamaAssembler(_Assembler):
    """Ollama NDJSON chunks -> the non-streaming /api/generate or /api/chat object."""

    KINDS = (Kind.GENERATE, Kind.CHAT)

    def __init__(self, kind: Kind, limit: int, *, keep_text: bool = True) -> None:
        super().__init__(kind, limit, keep_text=keep_text)
        self._content = _Text()
        self._thinking = _Text()
        self._tool_calls: list[Any] = []
        self._role = "assistant"
        self._final: dict[str, Any] | None = None

    @property
    def final_seen(self) -> bool:
        return self._final is not None

    def feed_line(self, line: bytes) -> None:
        """One NDJSON line of the engine's stream."""
        obj = decode_ndjson(line)
        if obj is not None:
            self.feed(obj)

    def feed(self, obj: dict[str, Any]) -> None:
        message = error_message(obj)
        if message is not None:
            self.error = message
            return
        if self.kind is Kind.GENERATE:
            self._content.add(self._budget, obj.get("response"))
            self._thinking.add(self._budget, obj.get("thinking"))
        else:
            msg = obj.get("message")
            if isinstance(msg, dict):
                role = msg.get("role")
                if isinstance(role, str) and role:
                    self._role = role
                self._content.add(self._budget, msg.get("content"))
                self._thinking.add(self._budget, msg.get("thinking"))
                calls = msg.get("tool_calls")
                if isinstance(calls, list) and self._budget.take(len(json.dumps(calls))):
                    self._tool_calls.extend(calls)
        if obj.get("done") is True:
            self._final = obj

    def timing(self) -> EngineTiming | None:
        return None if self._final is None else timing_from_ollama(self._final)

    def result(self) -> dict[str, Any]:
        if self._final is None:
            raise StreamError("upstream stream ended before its final (done) object")
        out = dict(self._final)
        if self.kind is Kind.GENERATE:
            out["response"] = self._content.text()
            if self._thinking.pieces:
                out["thinking"] = self._thinking.text()
        else:
            final_msg = out.get("message")
            message: dict[str, Any] = dict(final_msg) if isinstance(final_msg, dict) else {}
            message["role"] = self._role
            message["content"] = self._content.text()
            if self._thinking.pieces:
                message["thinking"] = self._thinking.text()
            if self._tool_calls:
                message["tool_calls"] = self._tool_calls
            out["message"] = message
        return out


@dataclass
class _Choice:
    index: int
    role: str
    content: _Text
    reasoning: _Text
    tool_calls: dict[int, dict[str, Any]]
    logprobs: list[Any]
    finish_reason: str | None = None


class OpenAIAssembler(_Assembler):
    """chat.completion.chunk / text_completion SSE events -> one completion object."""

    KINDS = (Kind.OPENAI_CHAT, Kind.OPENAI_COMPLETION)

    def __init__(self, kind: Kind, limit: int, *, keep_text: bool = True) -> None:
        super().__init__(kind, limit, keep_text=keep_text)
        self._choices: dict[int, _Choice] = {}
        self._meta: dict[str, Any] = {}
        self._usage: dict[str, Any] | None = None
        self._timings: dict[str, Any] | None = None
        self.done = False

    @property
    def finished(self) -> bool:
        return self.done or self.error is not None

    @property
    def final_seen(self) -> bool:
        return self.done or self.finish_reason is not None

    def feed_line(self, line: bytes) -> None:
        """One SSE line of the engine's stream (non-`data:` lines carry nothing)."""
        payload = sse_data(line)
        if payload is not None:
            self.feed(decode_event(payload))

    def _choice(self, index: int) -> _Choice:
        choice = self._choices.get(index)
        if choice is None:
            choice = _Choice(index, "assistant", _Text(), _Text(), {}, [])
            self._choices[index] = choice
        return choice

    def feed(self, event: dict[str, Any] | object) -> None:
        if event is DONE:
            self.done = True
            return
        assert isinstance(event, dict)
        message = error_message(event)
        if message is not None:
            self.error = message
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in event and key not in self._meta:
                self._meta[key] = event[key]
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        timings = event.get("timings")
        if isinstance(timings, dict):
            self._timings = timings
        choices = event.get("choices")
        if not isinstance(choices, list):
            return
        for raw in choices:
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self._choice(index if isinstance(index, int) else 0)
            if self.kind is Kind.OPENAI_CHAT:
                self._feed_delta(choice, raw.get("delta"))
                logprobs = raw.get("logprobs")
                if (
                    isinstance(logprobs, dict)
                    and isinstance(logprobs.get("content"), list)
                    and self._budget.keep
                ):
                    choice.logprobs.extend(logprobs["content"])
            else:
                choice.content.add(self._budget, raw.get("text"))
            reason = raw.get("finish_reason")
            if isinstance(reason, str):
                choice.finish_reason = reason

    def _feed_delta(self, choice: _Choice, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        role = delta.get("role")
        if isinstance(role, str) and role:
            choice.role = role
        choice.content.add(self._budget, delta.get("content"))
        choice.reasoning.add(self._budget, delta.get("reasoning_content"))
        calls = delta.get("tool_calls")
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict) or not self._budget.take(len(json.dumps(call))):
                continue
            idx = call.get("index", len(choice.tool_calls))
            slot = choice.tool_calls.setdefault(
                idx if isinstance(idx, int) else len(choice.tool_calls),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if isinstance(call.get("id"), str):
                slot["id"] = call["id"]
            if isinstance(call.get("type"), str):
                slot["type"] = call["type"]
            function = call.get("function")
            if isinstance(function, dict):
                for part in ("name", "arguments"):
                    if isinstance(function.get(part), str):
                        slot["function"][part] += function[part]

    @property
    def finish_reason(self) -> str | None:
        for index in sorted(self._choices):
            reason = self._choices[index].finish_reason
            if reason is not None:
                return reason
        return None

    def timing(self) -> EngineTiming:
        return timing_from_openai(self._usage, self._timings, self.finish_reason)

    def _usage_or_estimate(self) -> dict[str, Any]:
        if self._usage is not None:
            return self._usage
        timing = self.timing()
        prompt = timing.prompt_tokens or 0
        completion = timing.generated_tokens
        if completion is None:
            completion = sum(len(c.content.pieces) for c in self._choices.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def result(self) -> dict[str, Any]:
        if not self._choices or any(c.finish_reason is None for c in self._choices.values()):
            raise StreamError("upstream stream ended before every choice had a finish_reason")
        chat = self.kind is Kind.OPENAI_CHAT
        choices: list[dict[str, Any]] = []
        for index in sorted(self._choices):
            c = self._choices[index]
            if chat:
                message: dict[str, Any] = {"role": c.role, "content": c.content.text()}
                if c.tool_calls:
                    message["tool_calls"] = [c.tool_calls[i] for i in sorted(c.tool_calls)]
                    if not c.content.pieces:
                        message["content"] = None
                if c.reasoning.pieces:
                    message["reasoning_content"] = c.reasoning.text()
                entry: dict[str, Any] = {
                    "index": index,
                    "message": message,
                    "finish_reason": c.finish_reason,
                }
                if c.logprobs:
                    entry["logprobs"] = {"content": c.logprobs}
            else:
                entry = {
                    "index": index,
                    "text": c.content.text(),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            choices.append(entry)
        out: dict[str, Any] = {
            "id": self._meta.get("id", ""),
            "object": "chat.completion" if chat else "text_completion",
            "created": self._meta.get("created", 0),
            "model": self._meta.get("model", ""),
        }
        if "system_fingerprint" in self._meta:
            out["system_fingerprint"] = self._meta["system_fingerprint"]
        out["choices"] = choices
        out["usage"] = self._usage_or_estimate()
        if self._timings is not None:
            out["timings"] = self._timings
        return out


Assembler = OllamaAssembler | OpenAIAssembler


def assembler_for(kind: Kind, limit: int, *, keep_text: bool = True) -> Assembler:
    """The assembler for a generation route's stream format."""
    if kind in (Kind.GENERATE, Kind.CHAT):
        return OllamaAssembler(kind, limit, keep_text=keep_text)
    return OpenAIAssembler(kind, limit, keep_text=keep_text)


class StreamWatcher:
    """For callers that stream: bytes are relayed untouched; this only reads the
    few lines that carry the final timing or an error, found by a cheap
    substring test so that relaying stays fast, and hands them to an assembler
    that keeps no text (the one parser of both stream formats)."""

    _OLLAMA_MARKERS = re.compile(rb'"done":\s*true|"error"')
    _SSE_MARKERS = re.compile(rb'"timings"|"usage"|"error"|"finish_reason":\s*"|\[DONE\]')

    def __init__(self, kind: Kind) -> None:
        self._reader = assembler_for(kind, 0, keep_text=False)
        ollama = isinstance(self._reader, OllamaAssembler)
        self._markers = self._OLLAMA_MARKERS if ollama else self._SSE_MARKERS
        self._lines = LineSplitter()

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            if self._markers.search(line) is not None:
                self._reader.feed_line(line)

    def close(self) -> None:
        rest = self._lines.flush()
        if rest and self._markers.search(rest) is not None:
            self._reader.feed_line(rest)

    @property
    def timing(self) -> EngineTiming | None:
        return self._reader.timing()

    @property
    def error(self) -> str | None:
        return self._reader.error

    @property
    def final_seen(self) -> bool:
        return self._reader.final_seen
