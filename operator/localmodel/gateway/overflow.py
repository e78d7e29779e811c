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
    """One request translated for the overflow endpoint: its path, body, and how the answer goes
    back."""

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

    def __init__(self, kind: Kind, model: str, created_at: str, secret: str = "") -> None:
        if kind not in (Kind.CHAT, Kind.GENERATE):
            raise ValueError(f"not an Ollama generation route: {kind}")
        self.kind = kind
        self.model = model
        self.created_at = created_at
        self._secret = secret
        # The API key scrubbed from the text told, across the endpoint's
        # events: a key streamed a token at a time is still found.
        self._content = KeyScrubber(secret)
        self._thinking = KeyScrubber(secret)
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
        content = scrub(_text_or_empty(msg.get("content")), self._secret)
        thinking = scrub(_text_or_empty(msg.get("reasoning_content")), self._secret)
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
        return out + self._held() + _line(self._final())

    def _line(self, line: bytes) -> bytes:
        payload = sse_data(line)
        if payload is None or self.done:
            return b""
        event = decode_event(payload)
        if event is DONE:
            if self._finish is None:
                raise StreamError("overflow stream ended before its last choice")
            return self._held() + _line(self._final())
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
        content = _through(self._content, _text_or_empty(delta.get("content")))
        thinking = _through(self._thinking, _text_or_empty(delta.get("reasoning_content")))
        if not content and not thinking:
            return b""
        return _line(self._object(content, thinking))

    def _held(self) -> bytes:
        """The text held back in case it began the key, told before the end."""
        content = self._content.close().decode("utf-8", "surrogatepass")
        thinking = self._thinking.close().decode("utf-8", "surrogatepass")
        return _line(self._object(content, thinking)) if content or thinking else b""


def _through(scrubber: KeyScrubber, text: str) -> str:
    """Text through a scrubber (what may begin the key is held back)."""
    if not text:
        return text
    return scrubber.feed(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")


def _text_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _line(obj: dict[str, Any]) -> bytes:
    return encode(obj) + b"\n"


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


REDACTED = b"[redacted]"


def key_forms(secret: str) -> tuple[bytes, ...]:
    """The byte forms the API key may take in an answer: as it is, and as a
    JSON encoder may escape it (`"` and `\\`; `/` as `\\/`, which some do)."""
    if not secret:
        return ()
    forms = {secret.encode()}
    escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
    forms.add(escaped.encode())
    forms.add(escaped.replace("/", "\\/").encode())
    return tuple(sorted(forms, key=len, reverse=True))


class KeyScrubber:
    """Bytes in, the same bytes out with every form of the API key replaced,
    however the key is split across the pieces fed: the longest tail that may
    begin a key is held back until the next piece (or `close`) says. Held
    back: at most one key's length; nothing at all unless the tail could
    begin a key."""

    def __init__(self, secret: str) -> None:
        self._forms = key_forms(secret)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self._forms:
            return data
        text = self._held + data
        out = bytearray()
        start = 0
        while True:
            found = self._next(text, start)
            if found is None:
                break
            at, form = found
            if any(f.startswith(text[at:]) for f in self._forms if len(f) > len(text) - at):
                # A longer form may still begin here (a key ending in `\\`).
                out += text[start:at]
                self._held = text[at:]
                return bytes(out)
            out += text[start:at] + REDACTED
            start = at + len(form)
        keep = self._tail(text, start)
        out += text[start:keep]
        self._held = text[keep:]
        return bytes(out)

    def close(self) -> bytes:
        """The end of the stream: what was held back could begin no key."""
        held, self._held = self._held, b""
        return held

    def _next(self, text: bytes, start: int) -> tuple[int, bytes] | None:
        """The first key form at or after `start` (the longest where several begin)."""
        best: tuple[int, bytes] | None = None
        for form in self._forms:
            at = text.find(form, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, form)
        return best

    def _tail(self, text: bytes, start: int) -> int:
        """Where the longest tail of text[start:] that begins a key form starts."""
        longest = max(len(form) for form in self._forms) - 1
        for at in range(max(start, len(text) - longest), len(text)):
            tail = text[at:]
            if any(form.startswith(tail) for form in self._forms):
                return at
        return len(text)


@overload
def scrub(text: str, secret: str) -> str: ...
@overload
def scrub(text: bytes, secret: str) -> bytes: ...
def scrub(text: str | bytes, secret: str) -> str | bytes:
    """Text or bytes that may echo the API key (an endpoint's error body, the
    overflow's answer relayed), every form of the key removed."""
    if not secret:
        return text
    scrubber = KeyScrubber(secret)
    if isinstance(text, bytes):
        return scrubber.feed(text) + scrubber.close()
    # A key's UTF-8 bytes found in UTF-8 text begin and end on characters
    # (surrogatepass: a lone surrogate from a JSON string stays as it was).
    raw = text.encode("utf-8", "surrogatepass")
    return (scrubber.feed(raw) + scrubber.close()).decode("utf-8", "surrogatepass")
