"""Which session a request belongs to, and which replica owns it. Pure.

A session's key is its `X-LocalModel-Session` header when the caller sends
one; without it, a fingerprint of the conversation's opening, the part that
every later turn repeats unchanged: the system messages and the first user
message of a chat, or the first `FINGERPRINT_CHARS` characters of a prompt
(completions, generate, with Ollama's `system`). Whitespace is collapsed so
a client that re-serialises the history the same words still lands on the
same key. Two conversations that open identically share a key; so do their
caches' prefixes, which is what the key is for.

The owner is chosen by rendezvous (highest random weight) hashing: each
replica's weight for a key is a hash of (key, replica id: namespace/pod,
router/table.py); the heaviest owns it. Every router computes the same owner
from the same ids without talking, a replica that joins takes only the keys
it now outweighs, and one that leaves gives up only its own
(tests/router/test_router_core.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from localmodel.gateway_contract.headers import MAX_SESSION_CHARS

FINGERPRINT_CHARS = 512  # of a prompt's opening: a system prompt and the first question fit


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list (OpenAI's content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _normal(text: str) -> str:
    return " ".join(text.split())


def opening(body: Mapping[str, Any]) -> str | None:
    """The conversation's opening as normalised text, or None when the body has none."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if role in ("system", "developer"):
                parts.append(f"{role}:{_normal(_text(message.get('content')))}")
            elif role == "user":
                parts.append(f"user:{_normal(_text(message.get('content')))}")
                break
        return "\n".join(parts) if parts else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        system = body.get("system")
        head = f"system:{_normal(system)}\n" if isinstance(system, str) else ""
        return head + "prompt:" + _normal(prompt[: FINGERPRINT_CHARS * 2])[:FINGERPRINT_CHARS]
    return None


CHARS_PER_TOKEN = 4  # English text in the common tokenizers: an estimate, rounded down


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The request's prompt in tokens, estimated from its text's length."""
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = sum(len(_text(m.get("content"))) for m in messages if isinstance(m, dict))
    for key in ("prompt", "system"):
        value = body.get(key)
        if isinstance(value, str):
            chars += len(value)
    return chars // CHARS_PER_TOKEN


def session_key(header: str | None, body: Mapping[str, Any], salt: bytes = b"") -> str | None:
    """The session's key: `h:` and the header's digest, or `f:` and the opening's;
    None when neither exists (the request is then placed by its own digest).
    The digest is keyed with `salt` (router/signing.py's, from the router's
    private key; at most 64 bytes), so a key seen in a gateway's /slots does
    not confirm a guessed prompt to anyone without that key."""
    if header is not None and header.strip():
        return "h:" + _digest(header.strip()[:MAX_SESSION_CHARS], salt)
    text = opening(body)
    return None if text is None else "f:" + _digest(text, salt)


def _digest(text: str, salt: bytes = b"") -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12,
                           key=salt).hexdigest()


def weight(key: str, replica: str) -> int:
    """The replica's rendezvous weight for `key`."""
    raw = hashlib.blake2b(f"{key}\0{replica}".encode("utf-8", "surrogatepass"),
                          digest_size=8).digest()
    return int.from_bytes(raw, "big")


def ranking(key: str, replicas: Iterable[str]) -> list[str]:
    """Replica names, heaviest first: the owner, then where the key goes if it
    leaves (ties, never expected of 64-bit weights, broken by name)."""
    return sorted(set(replicas), key=lambda name: (-weight(key, name), name))


def owner(key: str, replicas: Sequence[str]) -> str:
    return ranking(key, replicas)[0]
