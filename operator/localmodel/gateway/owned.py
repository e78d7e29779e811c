"""The sessions routers sent here as their owner: what /slots lists as
`owned_sessions`, so every router agrees where a session lives without the
routers talking to each other (docs/router.md, Sessions stay with their cache).

A router sends `X-LocalModel-Owned-Session: KEY` on a turn it sends to the
session's owner (never on a spilled turn); the gateway keeps the keys of the
turns it answered, most recent first, at most `MAX_KEPT`, each forgotten
`SESSION_IDLE_S` after its last turn (the router forgets an idle session as long
after). A value that is not a session key (gateway_contract/headers.py's
SESSION_KEY_PATTERN) is ignored: the header crosses a trust boundary, and
what it can do is bounded to steering a session the sender can name (a
digest) to this replica. Pure but for the clock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from localmodel.gateway_contract.headers import OWNED_SESSIONS_LISTED, SESSION_IDLE_S

MAX_KEPT = 4096  # keys kept; the least recently used is forgotten first


class OwnedSessions:
    def __init__(self, limit: int = MAX_KEPT, idle_s: float = SESSION_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.idle_s = idle_s
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # least recent first

    def touch(self, key: str | None) -> None:
        """Remember `key` (already checked by `owned_key`; None: nothing) as
        answered now."""
        if key is None:
            return
        self._seen.pop(key, None)
        self._seen[key] = self._clock()
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def listed(self, most: int = OWNED_SESSIONS_LISTED) -> list[str]:
        """The keys answered within SESSION_IDLE_S, most recent first, at most `most`."""
        now = self._clock()
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if now - seen <= self.idle_s:
                break
            del self._seen[key]
        out: list[str] = []
        for key in reversed(self._seen):
            if len(out) >= most:
                break
            out.append(key)
        return out

    def __len__(self) -> int:
        return len(self._seen)
