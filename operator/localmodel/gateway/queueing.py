"""Slots and the queue in front of them, live: the `SlotBoard` (pure) decides
who gets a slot; this part wakes the waiter it was given to, lets a waiter
leave, and runs a queued request's race against the overflow endpoint. With a
`WaitBook` (the ledger on) it also tells the book every grant, release and
wait, so each waiter learns whom it waited behind (`behind`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from localmodel.gateway.ledger import Holder, WaitBook
from localmodel.gateway.overflow_client import Overflowed, OverflowTry
from localmodel.gateway.slots import Admission, Priority, SlotBoard, retry_after_seconds


class SlotQueue:
    """Keeps the waits for the engine's slots: admits, queues or rejects a request, and wakes the
    next when a slot frees."""

    def __init__(
        self,
        slots: int,
        max_queue: int,
        book: WaitBook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.board = SlotBoard(slots, max_queue)
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._book = book
        self._clock = clock
        self._holder: dict[int, Holder] = {}  # queued tickets' holder names (book only)
        self._behind: dict[int, dict[Holder, float]] = {}  # waits ended, until collected

    @property
    def waiters(self) -> int:
        """Queued requests with a live wait (must equal the board's queue)."""
        return len(self._waiters)

    def reserve(self, priority: Priority) -> Admission:
        """Count a request before its body is read (`SlotBoard.reserve`)."""
        return self.board.reserve(priority)

    def unreserve(self) -> None:
        self.board.unreserve()

    def request(
        self, priority: Priority, holder: Holder | None = None, reserved: bool = False
    ) -> tuple[Admission, int]:
        """Ask for a slot (`reserved`: with the place `reserve` held); `holder`
        names the request in others' "waited behind"."""
        admission, ticket = self.board.request(priority, reserved)
        book = self._book
        if book is not None and ticket:
            name = holder or ("", priority.value)
            if admission is Admission.ADMITTED:
                book.hold(ticket, name, self._clock())
            else:
                self._holder[ticket] = name
                book.wait(ticket, self._clock())
        return admission, ticket

    def holds(self, ticket: int) -> bool:
        return self.board.holds(ticket)

    def release(self, ticket: int) -> None:
        """Give the slot back; the request it goes to wakes."""
        granted = self.board.release(ticket)
        book = self._book
        if book is not None:
            now = self._clock()
            book.free(ticket, now)
            if granted is not None:
                self._behind[granted] = book.stop(granted, now)
                book.hold(granted, self._holder.pop(granted, ("", "")), now)
        if granted is not None:
            waiter = self._waiters.pop(granted, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def leave(self, ticket: int) -> None:
        """A waiter gives up its place."""
        self._waiters.pop(ticket, None)
        if not self.board.withdraw(ticket):
            # Granted in the same instant it gave up: pass the slot on.
            self.release(ticket)
        elif self._book is not None:
            self._holder.pop(ticket, None)
            self._behind[ticket] = self._book.stop(ticket, self._clock())

    @property
    def pending_accounts(self) -> int:
        """Wait accounts not yet collected: 0 once every request has ended."""
        waiting = self._book.waiting if self._book is not None else 0
        return len(self._holder) + len(self._behind) + waiting

    def behind(self, ticket: int) -> dict[Holder, float]:
        """Whom `ticket` waited behind, seconds each (empty: it did not wait);
        collected once, when its request ends."""
        return self._behind.pop(ticket, {})

    def retry_after(self, mean_slot_seconds: float) -> dict[str, str]:
        snap = self.board.snapshot()
        seconds = retry_after_seconds(mean_slot_seconds, snap.queued, snap.total)
        return {"Retry-After": str(seconds)}

    async def wait(
        self, ticket: int, deadline_at: float, overflow: OverflowTry | None
    ) -> Overflowed | None:
        """Wait in the queue for a slot (returns None: the ticket holds one).

        With an overflow endpoint, a foreground request that has waited
        --overflow-after seconds is also sent there, once, racing the queue:
        whichever answers first serves it (a slot that frees first wins and the
        overflow connection is closed). If the overflow fails, the request
        keeps its place and waits locally. Ticket 0 (the queue is full): only
        the overflow can serve it. TimeoutError at the deadline.
        """
        race = _Race(self, ticket, deadline_at, overflow)
        try:
            return await race.run()
        finally:
            race.end()


class _Race:
    """One queued request's wait: its place in the queue against at most one
    overflow attempt (one per request: no retry storm)."""

    def __init__(
        self, queue: SlotQueue, ticket: int, deadline_at: float, overflow: OverflowTry | None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue = queue
        self.ticket = ticket
        self.deadline_at = deadline_at
        self.overflow = overflow
        self.waiter: asyncio.Future[None] = self.loop.create_future()
        if ticket:
            queue._waiters[ticket] = self.waiter
        self.attempt: asyncio.Task[Overflowed | None] | None = None
        self.overflow_at = math.inf
        if overflow is not None:
            # A full queue has no local wait to offer: overflow at once.
            self.overflow_at = self.loop.time() + (overflow.after if ticket else 0.0)
        self.granted = False

    async def run(self) -> Overflowed | None:
        while True:
            self._start_overflow_when_due()
            if self.attempt is None and not self.ticket:
                return None
            await self._next_event()
            if self.waiter.done():
                self.granted = True
                return None
            if self.attempt is not None and self.attempt.done():
                answered, self.attempt = self.attempt.result(), None
                if answered is not None:
                    return answered
                continue  # failed: wait locally
            if self.loop.time() >= self.deadline_at:
                if self.attempt is not None:
                    assert self.overflow is not None
                    self.overflow.timed_out()
                raise TimeoutError

    def _start_overflow_when_due(self) -> None:
        if self.attempt is not None or self.loop.time() < self.overflow_at:
            return
        self.overflow_at = math.inf  # one attempt per request
        assert self.overflow is not None
        sending = self.overflow.start()
        if sending is not None:
            self.attempt = self.loop.create_task(sending)

    async def _next_event(self) -> None:
        """Until a slot, the overflow's answer, the deadline or the time to overflow."""
        pending: set[asyncio.Future[Any]] = {self.waiter}
        if self.attempt is not None:
            pending.add(self.attempt)
        timeout = min(self.deadline_at, self.overflow_at) - self.loop.time()
        await asyncio.wait(pending, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)

    def end(self) -> None:
        """Close an overflow answer that lost, and leave the queue unless served."""
        attempt = self.attempt
        if attempt is not None:
            if attempt.done():
                late = attempt.result() if not attempt.cancelled() else None
                if late is not None:
                    late.upstream.close()
            else:
                attempt.cancel()  # closes the overflow connection
        if self.ticket and not self.granted:
            self.queue.leave(self.ticket)
