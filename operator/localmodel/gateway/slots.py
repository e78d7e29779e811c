"""Slot and queue accounting for the slot gate. Pure: no asyncio, no clock.

A request is counted before its body is read (`SlotBoard.reserve`): a place
held for it, among the slots and the queue, while it is read and parsed, so a
full queue refuses a newcomer before it costs any memory. Once parsed it asks
for its slot (`request(..., reserved=True)`), which a held place guarantees:
admitted or queued, never refused for a full queue.

A ticket is one request's claim on a slot. `SlotBoard.request` either admits it
(a slot is free), queues it (foreground only, bounded FIFO), or rejects it.
Background requests are never queued: the point of the gate is that jobs
which can retry later must not stand in front of a person who is waiting
(the field report: retries piling up ahead of the interactive caller). A freed
slot is handed straight to the head of the foreground queue, so the queue
drains in arrival order and nothing can overtake it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Priority(StrEnum):
    """A request's priority: foreground waits for a slot, background is turned away when none is
    free."""

    FOREGROUND = "foreground"
    BACKGROUND = "background"


def parse_priority(header: str | None) -> Priority:
    """X-Priority: `background` (any case) marks a job that can retry; all else waits."""
    if header is not None and header.strip().lower() == Priority.BACKGROUND.value:
        return Priority.BACKGROUND
    return Priority.FOREGROUND


class Admission(StrEnum):
    """What the slot board decided for a request: admitted, queued or rejected."""

    ADMITTED = "admitted"
    QUEUED = "queued"
    REJECTED_BUSY = "rejected_busy"  # background, no slot free -> 429
    REJECTED_QUEUE_FULL = "rejected_queue_full"  # foreground, queue full -> 503


@dataclass(frozen=True)
class SlotSnapshot:
    """The slots and queues at one moment: total, busy and queued by priority."""

    total: int
    busy: int
    queued_foreground: int
    queued_background: int
    queue_limit: int

    @property
    def free(self) -> int:
        return self.total - self.busy

    @property
    def queued(self) -> int:
        return self.queued_foreground + self.queued_background


class SlotBoard:
    """Who holds a slot and who waits for one."""

    def __init__(self, total: int, queue_limit: int) -> None:
        if total < 1:
            raise ValueError("a slot board needs at least one slot")
        if queue_limit < 0:
            raise ValueError("queue limit must be >= 0")
        self.total = total
        self.queue_limit = queue_limit
        self._next = 0
        self._reserved = 0  # requests counted whose bodies are being read
        self._holders: set[int] = set()
        # Insertion-ordered: the FIFO. Values are unused.
        self._waiting: OrderedDict[int, None] = OrderedDict()

    def _ticket(self) -> int:
        self._next += 1
        return self._next

    def reserve(self, priority: Priority) -> Admission:
        """Count a request whose body is still to be read: QUEUED (a place is
        held for it; `request` or `unreserve` gives it back) or the refusal it
        would get now. Background requests are never queued, so one is refused
        when every slot is held or spoken for."""
        counted = len(self._holders) + len(self._waiting) + self._reserved
        if priority is Priority.BACKGROUND and counted >= self.total:
            return Admission.REJECTED_BUSY
        if counted >= self.total + self.queue_limit:
            return Admission.REJECTED_QUEUE_FULL
        self._reserved += 1
        return Admission.QUEUED

    def unreserve(self) -> None:
        """A counted request ended before it asked for its slot."""
        if self._reserved < 1:
            raise ValueError("no place is reserved")
        self._reserved -= 1

    @property
    def reserved(self) -> int:
        return self._reserved

    def request(self, priority: Priority, reserved: bool = False) -> tuple[Admission, int]:
        """Ask for a slot (`reserved`: with the place `reserve` held, which
        guarantees a place). Returns the admission and the ticket (0 when
        rejected)."""
        if not reserved:
            refused = self.reserve(priority)
            if refused is not Admission.QUEUED:
                return refused, 0
        self.unreserve()
        if len(self._holders) < self.total and not self._waiting:
            ticket = self._ticket()
            self._holders.add(ticket)
            return Admission.ADMITTED, ticket
        if priority is Priority.BACKGROUND:
            return Admission.REJECTED_BUSY, 0
        # Room is certain: holders + queue + reserved never pass slots + queue limit.
        ticket = self._ticket()
        self._waiting[ticket] = None
        return Admission.QUEUED, ticket

    def release(self, ticket: int) -> int | None:
        """Free the ticket's slot. Returns the queued ticket that now holds it, if any."""
        if ticket not in self._holders:
            raise KeyError(f"ticket {ticket} holds no slot")
        self._holders.remove(ticket)
        if self._waiting:
            granted, _ = self._waiting.popitem(last=False)
            self._holders.add(granted)
            return granted
        return None

    def withdraw(self, ticket: int) -> bool:
        """A queued request gives up. False if it was already granted a slot
        (then the caller holds the slot and must `release` it)."""
        if ticket in self._waiting:
            del self._waiting[ticket]
            return True
        if ticket in self._holders:
            return False
        raise KeyError(f"ticket {ticket} is unknown")

    def holds(self, ticket: int) -> bool:
        return ticket in self._holders

    def position(self, ticket: int) -> int | None:
        """0-based place in the queue, or None when not queued."""
        for i, waiting in enumerate(self._waiting):
            if waiting == ticket:
                return i
        return None

    def snapshot(self) -> SlotSnapshot:
        return SlotSnapshot(
            total=self.total,
            busy=len(self._holders),
            queued_foreground=len(self._waiting),
            queued_background=0,
            queue_limit=self.queue_limit,
        )


def retry_after_seconds(mean_busy_seconds: float, queued: int, total_slots: int) -> int:
    """A Retry-After hint: the expected wait for one slot, 1..120 s.

    With `queued` requests ahead and `total_slots` slots each busy for about
    `mean_busy_seconds`, a newcomer waits about (queued + 1) / slots of that.
    """
    if total_slots < 1:
        total_slots = 1
    if not mean_busy_seconds > 0 or math.isinf(mean_busy_seconds):
        return 1
    estimate = mean_busy_seconds * (queued + 1) / total_slots
    return max(1, min(120, math.ceil(estimate)))


def slots_document(
    snap: SlotSnapshot, model: str, engine: str, threads: int | None, context: int | None,
    owned: list[str] | None = None,
) -> dict[str, Any]:
    """The body of GET /slots; `owned`: the sessions routers sent here as
    their owner, most recent first (gateway/owned.py)."""
    return {
        "model": model,
        "engine": engine,
        "total": snap.total,
        "busy": snap.busy,
        "free": snap.free,
        "queued": {
            "foreground": snap.queued_foreground,
            "background": snap.queued_background,
        },
        "queue_limit": snap.queue_limit,
        "threads": threads,
        "context": context,
        "owned_sessions": owned or [],
    }
