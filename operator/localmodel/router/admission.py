"""Admission before work at the router: a request holds one of --places
places before its body is read (none free: 503 with Retry-After, its body
left unread), and at most --body-reads bodies are read and parsed at once
(gateway_contract/reads.py, `BodyReads`, the gateway's own).

What a request costs the router is bounded by these two numbers: a place
holds at most one body of --max-body-bytes (its bytes, and their copy sent
to the replica) for as long as the request lasts; a read holds up to twice
that while it arrives, and the parse, which runs on the event loop one at a
time, up to ~25 times it, gone before the request is relayed
(router/wanted.py keeps only what routing needs). A body announced small
(SMALL_BODY) is read without a turn: a normal chat never waits behind large
ones, and the places bound what small ones hold. The chart's memory limit
is sized from these (router/config.py, router_memory_bytes;
docs/benchmarks.md, Hostile bodies at the router).
"""

from __future__ import annotations

RETRY_AFTER_S = 1  # a place frees as soon as any request ends
# A body announced at most this long is read without waiting for a turn: a
# chat's turn is this small, and never waits behind large bodies; every
# place holding one costs at most twice this (64 places: 8 MiB).
SMALL_BODY = 64 * 1024


class Places:
    """The requests in progress, at most `limit` (the check and the count are
    one step on the event loop: no await between them)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self) -> bool:
        if self.held >= self.limit:
            return False
        self.held += 1
        return True

    def give(self) -> None:
        self.held -= 1
