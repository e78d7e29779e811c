"""Assembling one response from the engine's stream. Pure.

The streams' formats and their reading are in stream.py. A non-streaming
caller gets the object the engine would have sent it: the assemblers collect
the token chunks of either format into it. Memory is bounded: lines and the
assembled text have limits, and token chunks are kept as text pieces only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from localmodel.gateway.routes import Kind
from localmodel.gateway.stream import (
    DONE,
    LineSplitter,
    StreamError,
    decode_event,
    decode_ndjson,
    error_message,
    sse_data,
)
from localmodel.gateway_contract.timing import EngineTiming, TimingReader


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

    def __init__(self, kind: Kind, limit: int, reader: TimingReader, *,
                 keep_text: bool = True) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"not a {type(self).__name__} route: {kind}")
        self.kind = kind
        self.reader = reader  # the engine's own account, read as its package says
        self._budget = _Budget(limit, keep_text)
        self.error: str | None = None

    @property
    def final_seen(self) -> bool:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        return self.final_seen or self.error is not None


class OllamaAssembler(_Assembler):
    """Ollama API NDJSON chunks (the callers' API, gateway_contract/client_api.py)
    -> the non-streaming /api/generate or /api/chat object; the final object's
    account is read by the engine's own reader."""

    KINDS = (Kind.GENERATE, Kind.CHAT)

    def __init__(self, kind: Kind, limit: int, reader: TimingReader, *,
                 keep_text: bool = True) -> None:
        super().__init__(kind, limit, reader, keep_text=keep_text)
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
        return None if self._final is None else self.reader.timing(self._final, None)

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
    """Keeps one choice of an answer being assembled from a stream: its text, reasoning, tool
    calls, logprobs and finish reason."""

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

    def __init__(self, kind: Kind, limit: int, reader: TimingReader, *,
                 keep_text: bool = True) -> None:
        super().__init__(kind, limit, reader, keep_text=keep_text)
        self._choices: dict[int, _Choice] = {}
        self._meta: dict[str, Any] = {}
        self._usage: dict[str, Any] | None = None
        # The engine's own account fields (its reader's KEYS), the last of each.
        self._account: dict[str, Any] = {}
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
        for key in self.reader.KEYS:
            if event.get(key) is not None:
                self._account[key] = event[key]
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
        return self.reader.timing({**self._account, "usage": self._usage}, self.finish_reason)

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
        out.update(self._account)
        return out


Assembler = OllamaAssembler | OpenAIAssembler


def assembler_for(kind: Kind, limit: int, reader: TimingReader, *,
                  keep_text: bool = True) -> Assembler:
    """The assembler for a generation route's stream format, reading the
    engine's account as its package says (`reader`)."""
    if kind in (Kind.GENERATE, Kind.CHAT):
        return OllamaAssembler(kind, limit, reader, keep_text=keep_text)
    return OpenAIAssembler(kind, limit, reader, keep_text=keep_text)


class StreamWatcher:
    """For callers that stream: bytes are relayed untouched; this only reads the
    few lines that carry the final timing or an error, found by a cheap
    substring test so that relaying stays fast, and hands them to an assembler
    that keeps no text (the one parser of both stream formats)."""

    _OLLAMA_MARKERS = re.compile(rb'"done":\s*true|"error"')
    _SSE_MARKERS = rb'"usage"|"error"|"finish_reason":\s*"|\[DONE\]'

    def __init__(self, kind: Kind, reader: TimingReader) -> None:
        self._reader = assembler_for(kind, 0, reader, keep_text=False)
        ollama = isinstance(self._reader, OllamaAssembler)
        self._markers = self._OLLAMA_MARKERS if ollama else self._sse_markers(reader)
        self._lines = LineSplitter()

    @classmethod
    def _sse_markers(cls, reader: TimingReader) -> re.Pattern[bytes]:
        """OpenAI's final fields, and the engine's own account fields."""
        keys = b"".join(b'|"' + re.escape(key.encode()) + b'"' for key in reader.KEYS)
        return re.compile(cls._SSE_MARKERS + keys)

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
