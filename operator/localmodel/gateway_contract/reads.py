"""Bodies read and parsed at once, at most --body-reads: what a body costs
while it arrives (its bytes, up to twice its size) and while it is parsed
(up to ~25 times it) adds up, so the gateway and the router each read a few
at a time and the others wait their turn (`BodyReads`).

The router lets a body announced at most `small` bytes skip the wait (its
SMALL_BODY: a chat's turn never waits behind large bodies; its places bound
what small ones hold); the gateway passes `small=0`: every body waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class BodyReads:
    """Decides which request bodies are read at once: a bounded number of turns, small bodies
    without one."""

    def __init__(self, limit: int, small: int = 0) -> None:
        self._gate = asyncio.Semaphore(limit)
        self.small = small
        self.reading = 0  # bodies holding a turn
        self.waiting = 0  # bodies waiting for one

    def skips(self, announced: int | None) -> bool:
        """A body announced this long (None: chunked, unknown) needs no turn."""
        return announced is not None and announced <= self.small

    async def acquire(self) -> None:
        """Wait for a turn (cancel or time out the wait to give it up)."""
        self.waiting += 1
        try:
            await self._gate.acquire()
        finally:
            self.waiting -= 1
        self.reading += 1

    def release(self) -> None:
        self.reading -= 1
        self._gate.release()

    @contextlib.asynccontextmanager
    async def turn(self, announced: int | None) -> AsyncIterator[None]:
        """Hold a turn for a body of `announced` bytes while the block runs
        (none for a small one)."""
        if self.skips(announced):
            yield
            return
        await self.acquire()
        try:
            yield
        finally:
            self.release()
