"""What a replica holds of a session after a turn, from the answer itself. Pure.

The last answer's prompt accounting says how long the conversation is now on
the replica that answered: its prompt tokens plus the tokens it generated
(the engine keeps both in its cache). The router reads it from the tail of
the answer it relayed, without holding the answer back: OpenAI's `usage`
(prompt_tokens, completion_tokens; in a stream, the last chunk when the
caller asked for it), llama-server's `timings` (cache_n + prompt_n +
predicted_n, in every stream's last chunk), Ollama's prompt_eval_count +
eval_count (the last line), read as the gateway reads them: by each engine's
own reader (engines/<name>/timing.py; the router does not know which engine
answered, so it asks every engine's, `held_tokens` in
gateway_contract/timing.py). Only the last `TAIL_BYTES` are kept; an answer
that says none of them teaches nothing.

`SessionBook` remembers, per session, the tokens each replica holds, for the
`MAX_SESSIONS` most recently used sessions (soft state: a router that
restarts, or the other router, starts from nothing, and only the spill
estimate is poorer for it; the owner does not change).
"""

from __future__ import annotations

import json
from collections import OrderedDict

from localmodel.engines import timings
from localmodel.gateway_contract.timing import TimingReader, held_tokens

TAIL_BYTES = 16 * 1024
MAX_SESSIONS = 10_000
MAX_REPLICAS_PER_SESSION = 8


def tokens_from_tail(tail: bytes, readers: tuple[TimingReader, ...] | None = None) -> int | None:
    """The last accounting found in an answer's tail: a JSON body, SSE
    `data:` lines or NDJSON lines, read by `readers` (default: every engine's)."""
    readers = timings.readers() if readers is None else readers
    marks = ("usage", *(key for reader in readers for key in reader.KEYS))
    text = tail.decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line.startswith("{") or not any(mark in line for mark in marks):
            continue
        try:
            found = held_tokens(json.loads(line), readers)
        except ValueError:
            continue
        if found is not None:
            return found
    return None


class Tail:
    """The last TAIL_BYTES of a relayed answer."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > TAIL_BYTES:
            del self.data[: len(self.data) - TAIL_BYTES]


class SessionBook:
    """Keeps each session's held tokens per replica, least recent forgotten first."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._held: OrderedDict[str, dict[str, int]] = OrderedDict()

    def held(self, key: str) -> dict[str, int]:
        return dict(self._held.get(key, {}))

    def record(self, key: str, replica: str, tokens: int) -> None:
        held = self._held.pop(key, {})
        held.pop(replica, None)
        held[replica] = tokens
        while len(held) > MAX_REPLICAS_PER_SESSION:
            del held[next(iter(held))]
        self._held[key] = held
        while len(self._held) > self.limit:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        return len(self._held)
