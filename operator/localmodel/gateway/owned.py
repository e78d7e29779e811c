"""The sessions routers sent here as their owner: what /slots lists as
`owned_sessions`, so every router agrees where a session lives without the
routers talking to each other (docs/router.md, Sessions stay with their cache).

A router sends `X-LocalModel-Owned-Session: KEY` on a turn it sends to the
session's owner (never on a spilled turn), with its signed mark for this
replica and that key (gateway_contract/marks.py); the gateway keeps the keys
of the generation turns it answered with a 2xx, most recent first, at most
`MAX_KEPT`, each forgotten `SESSION_IDLE_S` after its last turn (the router
forgets an idle session as long after). Without the router's key
(--router-key), a valid mark made for this pod (--pod-namespace, --pod-name)
within marks.MARK_WINDOW_S, or a value that is a session key
(gateway_contract/headers.py's SESSION_KEY_PATTERN), the header is ignored:
a caller cannot steer sessions, and /slots lists the keys only to a request
with the router's `slots` mark (`RouterMarks`). `RouterMarks` also checks the
operator's `yield` mark on a close (gateway/door.py) and the router's `woke`
mark on a request it held for a wake. Pure but for the clocks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.headers import (
    MAX_WOKE_REQUEST_ID,
    OWNED_SESSION_HEADER,
    OWNED_SESSIONS_LISTED,
    REQUEST_ID_HEADER,
    SESSION_IDLE_S,
    WOKE_HEADER,
    WOKE_MARK_HEADER,
    owned_key,
    woke_ms,
)
from localmodel.gateway_contract.marks import (
    MARK_HEADER,
    OWNED,
    SLOTS,
    WOKE,
    YIELD,
    public_key,
    signed_message,
    verify,
    woke_session,
    yield_session,
)

MAX_KEPT = 4096  # keys kept; the least recently used is forgotten first


class OwnedSessions:
    """Keeps the session keys routers sent here as their owner, most recent last, forgotten when
    idle or past the limit."""

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


@dataclass(frozen=True)
class RouterMarks:
    """What this replica accepts as the router's (and the operator's) word:
    marks made with the router's key (None: none) for this pod."""

    key: Ed25519PublicKey | None
    namespace: str
    pod: str
    wall: Callable[[], float] = field(default=time.time, compare=False)

    @classmethod
    def of(cls, config: GatewayConfig) -> RouterMarks:
        key = public_key(config.router_key) if config.router_key else None
        return cls(key, config.pod_namespace, config.pod_name)

    def owned(self, headers: Mapping[str, str]) -> str | None:
        """The owned session's key when the router signed it for this replica."""
        key = owned_key(headers.get(OWNED_SESSION_HEADER))
        if key is None or not verify(self.key, headers.get(MARK_HEADER), OWNED,
                                     self.namespace, self.pod, key, self.wall()):
            return None
        return key

    def slots(self, headers: Mapping[str, str]) -> bool:
        """Whether a /slots read is the router's (it may see session keys)."""
        return verify(self.key, headers.get(MARK_HEADER), SLOTS, self.namespace, self.pod, "",
                      self.wall())

    def yielding(self, headers: Mapping[str, str], reason: str, idle_at_least: int) -> str | None:
        """When the mark is the operator's `yield` mark for this replica and
        this call, what it authorises (`signed_message`: the caller takes it
        once, gateway/door.py's SeenMarks); None otherwise."""
        mark, session = headers.get(MARK_HEADER), yield_session(reason, idle_at_least)
        if mark is None or not verify(self.key, mark, YIELD, self.namespace, self.pod, session,
                                      self.wall()):
            return None
        return signed_message(mark, session)

    def woke(self, headers: Mapping[str, str]) -> float | None:
        """Seconds the router held this request for a wake, when it signed
        them for this replica and this request (X-Request-Id); None otherwise."""
        ms = woke_ms(headers.get(WOKE_HEADER))
        request_id = headers.get(REQUEST_ID_HEADER) or ""
        if ms is None or len(request_id) > MAX_WOKE_REQUEST_ID:
            return None
        if not verify(self.key, headers.get(WOKE_MARK_HEADER), WOKE, self.namespace, self.pod,
                      woke_session(request_id, ms), self.wall()):
            return None
        return ms / 1000
