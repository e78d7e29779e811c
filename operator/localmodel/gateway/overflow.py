"""The overflow endpoint: where a foreground request goes when no local slot
frees in time. Pure: the request sent there, the answer told back in the
caller's shape, and when to leave a failing endpoint alone.

A CPU-only local model is for work nobody waits on; a person must not queue
behind it. So a foreground request that cannot start locally within
`--overflow-after` seconds is sent to an OpenAI-compatible endpoint (any
provider, or a bigger in-cluster server) with the model name replaced.
Background requests never overflow: they are the work the local model is for.

Which routes overflow:
- `/v1/chat/completions` and `/v1/completions`: the caller's body, model
  replaced, generation capped, streaming as the caller asked.
- `/api/chat` and `/api/generate` (Ollama callers): translated to a chat
  completion and the answer translated back to Ollama's NDJSON (streaming) or
  single object. Requests using what a chat completion cannot carry (images,
  tools, raw prompts, a `context`, a `suffix`, a template) wait locally.
- Embeddings never overflow: vectors from another model do not mix with the
  local model's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, overload

from localmodel.gateway.rewrite import (
    BadRequest,
    caller_stream_choice,
    cap_generation,
    encode,
    openai_caps,
    parse_json_object,
)
from localmodel.gateway.routes import Kind, Route
from localmodel.gateway.stream import (
    DONE,
    LineSplitter,
    StreamError,
    decode_event,
    error_message,
    sse_data,
)
from localmodel.gateway_contract import GatewayConfig

OVERFLOW_PATHS: dict[Kind, str] = {
    Kind.OPENAI_CHAT: "/chat/completions",
    Kind.OPENAI_COMPLETION: "/completions",
    Kind.CHAT: "/chat/completions",
    Kind.GENERATE: "/chat/completions",
}

# Ollama options with the same name and meaning in a chat completion.
_SAME_OPTIONS = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty")
# What a chat completion cannot carry: such requests wait locally.
_GENERATE_ONLY = ("raw", "context", "suffix", "images", "template")


class Untranslatable(ValueError):
    """The request cannot go to the overflow endpoint; it waits locally."""


@dataclass(frozen=True)
class OverflowRequest:
    path: str  # appended to --overflow-url
    body: bytes
    caller_streams: bool
    ollama: bool  # the answer is told back in Ollama's shape


def overflow_request(route: Route, raw: bytes, config: GatewayConfig) -> OverflowRequest:
    """The request for the overflow endpoint, or Untranslatable."""
    path = OVERFLOW_PATHS.get(route.kind)
    if path is None:
        raise Untranslatable(f"{route.path} does not overflow")
    try:
        body = parse_json_object(raw)
        stream = caller_stream_choice(route, body)
        if route.is_openai:
            body["model"] = config.overflow_model
            openai_caps(body, config)
            return OverflowRequest(path, encode(body), stream, ollama=False)
        chat = _chat_from_ollama(route.kind, body, config)
    except BadRequest as exc:  # pragma: no cover - the local rewrite refused it first
        raise Untranslatable(str(exc)) from None
    chat["stream"] = stream
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return OverflowRequest(path, encode(chat), stream, ollama=True)


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Untranslatable(f"{where} is not text")
    return value


def _chat_from_ollama(kind: Kind, body: dict[str, Any], config: GatewayConfig) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    if kind is Kind.GENERATE:
        used = [k for k in _GENERATE_ONLY if body.get(k) not in (None, False, "", [])]
        if used:
            raise Untranslatable(f"uses {', '.join(used)}")
        system = _text(body.get("system"), "system")
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": _text(body.get("prompt"), "prompt")})
    else:
        if body.get("tools"):
            raise Untranslatable("uses tools")
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list):
            raise Untranslatable("messages is not a list")
        for i, m in enumerate(raw_messages):
            if not isinstance(m, dict):
                raise Untranslatable(f"messages[{i}] is not an object")
            extra = [k for k in ("images", "tool_calls") if m.get(k)]
            role = m.get("role")
            if extra or role not in ("system", "user", "assistant"):
                raise Untranslatable(f"messages[{i}] uses {', '.join(extra) or f'role {role}'}")
            messages.append({"role": role, "content": _text(m.get("content"), "content")})
    chat: dict[str, Any] = {"model": config.overflow_model, "messages": messages}
    options = body.get("options")
    options = options if isinstance(options, dict) else {}
    for name in _SAME_OPTIONS:
        if options.get(name) is not None:
            chat[name] = options[name]
    predict = options.get("num_predict")
    requested = predict if isinstance(predict, int) and not isinstance(predict, bool) else None
    chat["max_tokens"] = cap_generation(requested, config.max_tokens)
    fmt = body.get("format")
    if fmt == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": fmt},
        }
    elif fmt not in (None, ""):
        raise Untranslatable("format is neither json nor a schema")
    return chat


def _done_reason(finish_reason: Any) -> str:
    return "length" if finish_reason == "length" else "stop"


class OllamaReply:
    """An OpenAI chat completion, streamed or whole, told in Ollama's shape
    (the NDJSON objects of /api/chat or /api/generate, then the final
    `done: true` object with `done_reason` and the token counts)."""

    def __init__(self, kind: Kind, model: str, created_at: str) -> None:
        if kind not in (Kind.CHAT, Kind.GENERATE):
            raise ValueError(f"not an Ollama generation route: {kind}")
        self.kind = kind
        self.model = model
        self.created_at = created_at
        self._lines = LineSplitter()
        self._finish: Any = None
        self._usage: dict[str, Any] = {}
        self.done = False

    def _object(self, content: str, thinking: str = "") -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": self.created_at}
        if self.kind is Kind.CHAT:
            message = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            obj["message"] = message
        else:
            obj["response"] = content
            if thinking:
                obj["thinking"] = thinking
        obj["done"] = False
        return obj

    def _final(self) -> dict[str, Any]:
        final = self._object("")
        final["done"] = True
        final["done_reason"] = _done_reason(self._finish)
        for ours, theirs in (
            ("prompt_eval_count", "prompt_tokens"),
            ("eval_count", "completion_tokens"),
        ):
            value = self._usage.get(theirs)
            if isinstance(value, int) and not isinstance(value, bool):
                final[ours] = value
        self.done = True
        return final

    def whole(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed chat.completion -> the Ollama object."""
        message = error_message(doc)
        if message is not None:
            raise StreamError(f"overflow endpoint error: {message}")
        choices = doc.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
            raise StreamError("overflow endpoint answered without a choice")
        msg = first["message"]
        self._finish = first.get("finish_reason")
        usage = doc.get("usage")
        self._usage = usage if isinstance(usage, dict) else {}
        out = self._final()
        content = _text_or_empty(msg.get("content"))
        thinking = _text_or_empty(msg.get("reasoning_content"))
        if self.kind is Kind.CHAT:
            out["message"]["content"] = content
            if thinking:
                out["message"]["thinking"] = thinking
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        return out

    def feed(self, data: bytes) -> bytes:
        """Bytes of the overflow's SSE stream -> NDJSON bytes for the caller."""
        out = bytearray()
        for line in self._lines.feed(data):
            out += self._line(line)
        return bytes(out)

    def close(self) -> bytes:
        """The end of the overflow's stream: the final object if not sent yet."""
        rest = self._lines.flush()
        out = self._line(rest) if rest else b""
        if self.done:
            return out
        if self._finish is None:
            raise StreamError("overflow stream ended before its last choice")
        return out + _line(self._final())

    def _line(self, line: bytes) -> bytes:
        payload = sse_data(line)
        if payload is None or self.done:
            return b""
        event = decode_event(payload)
        if event is DONE:
            if self._finish is None:
                raise StreamError("overflow stream ended before its last choice")
            return _line(self._final())
        assert isinstance(event, dict)
        message = error_message(event)
        if message is not None:
            raise StreamError(f"overflow endpoint error: {message}")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = event.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(first, dict):
            return b""
        if first.get("finish_reason") is not None:
            self._finish = first["finish_reason"]
        delta = first.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        content = _text_or_empty(delta.get("content"))
        thinking = _text_or_empty(delta.get("reasoning_content"))
        if not content and not thinking:
            return b""
        return _line(self._object(content, thinking))


def _text_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


@dataclass
class OverflowBreaker:
    """After a failure the endpoint is left alone for a while (`base` seconds,
    doubling while failures continue, at most `cap`), so a down endpoint costs
    one attempt per period, not one per queued request."""

    base: float = 5.0
    cap: float = 60.0
    failures: int = 0
    open_until: float = -math.inf

    def allows(self, now: float) -> bool:
        return now >= self.open_until

    def failed(self, now: float) -> None:
        self.failures += 1
        self.open_until = now + min(self.cap, self.base * 2 ** (self.failures - 1))

    def succeeded(self) -> None:
        self.failures = 0
        self.open_until = -math.inf


@overload
def scrub(text: str, secret: str) -> str: ...
@overload
def scrub(text: bytes, secret: str) -> bytes: ...
def scrub(text: str | bytes, secret: str) -> str | bytes:
    """Text or bytes that may echo the API key (an endpoint's error body, the
    overflow's answer relayed), key removed."""
    if not secret:
        return text
    if isinstance(text, bytes):
        return text.replace(secret.encode(), b"[redacted]")
    return text.replace(secret, "[redacted]")
