"""The queue's race against the overflow endpoint (gateway/queueing.py), on its
own: a queued request gets the slot that frees first, or the overflow's
answer if that comes first, never both; a failed overflow keeps its place; at
the deadline it leaves. The board's books (held slots, queue, live waits) are
checked after every race. The HTTP around it is test_overflow.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from localmodel.gateway.overflow import OverflowRequest
from localmodel.gateway.overflow_client import Overflowed, OverflowTry
from localmodel.gateway.queueing import SlotQueue
from localmodel.gateway.slots import Admission, Priority

FG = Priority.FOREGROUND
PLAN = OverflowRequest("/chat/completions", b"{}", caller_streams=False, ollama=False)


class Upstream:
    """Stands for the overflow's open response: only its closing is watched."""

    closed = False

    def close(self) -> None:
        self.closed = True


@dataclass
class Far:
    """The overflow side of one wait: answers after `delay` (or fails)."""

    delay: float
    answers: bool = True
    after: float = 0.0
    started: int = 0
    cancelled: bool = False
    timeouts: int = 0
    sent: list[Upstream] = field(default_factory=list)
    on_answer: Callable[[], None] | None = None

    def attempt(self) -> OverflowTry:
        def start() -> Coroutine[Any, Any, Overflowed | None]:
            self.started += 1
            return self._send()

        def timed_out() -> None:
            self.timeouts += 1

        return OverflowTry(self.after, start, timed_out)

    async def _send(self) -> Overflowed | None:
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if not self.answers:
            return None
        upstream = Upstream()
        self.sent.append(upstream)
        if self.on_answer is not None:
            self.on_answer()
        return Overflowed(PLAN, upstream)  # type: ignore[arg-type]


def queue_with_holder(max_queue: int = 4) -> tuple[SlotQueue, int]:
    queue = SlotQueue(1, max_queue)
    admission, holder = queue.request(FG)
    assert admission is Admission.ADMITTED
    return queue, holder


def books(queue: SlotQueue) -> tuple[int, int, int]:
    snap = queue.board.snapshot()
    return snap.busy, snap.queued, queue.waiters


def deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_a_freed_slot_wins_and_the_open_overflow_is_cancelled() -> None:
    queue, holder = queue_with_holder()
    _, ticket = queue.request(FG)
    far = Far(delay=10)
    wait = asyncio.create_task(queue.wait(ticket, deadline(5), far.attempt()))
    await asyncio.sleep(0.05)
    assert far.started == 1 and books(queue) == (1, 1, 1)
    queue.release(holder)
    assert await wait is None
    await asyncio.sleep(0)  # the cancelled attempt runs to its end
    assert queue.holds(ticket) and far.cancelled
    assert books(queue) == (1, 0, 0)


async def test_the_overflow_answering_first_serves_and_the_place_is_given_up() -> None:
    queue, _ = queue_with_holder()
    _, ticket = queue.request(FG)
    far = Far(delay=0.01)
    answered = await queue.wait(ticket, deadline(5), far.attempt())
    assert answered is not None
    upstream: Any = answered.upstream
    assert upstream is far.sent[0] and not upstream.closed  # the caller reads it next
    assert not queue.holds(ticket) and books(queue) == (1, 0, 0)


async def test_a_failed_overflow_keeps_the_place_and_is_not_retried() -> None:
    queue, holder = queue_with_holder()
    _, ticket = queue.request(FG)
    far = Far(delay=0.01, answers=False)
    wait = asyncio.create_task(queue.wait(ticket, deadline(5), far.attempt()))
    await asyncio.sleep(0.1)
    assert books(queue) == (1, 1, 1)
    queue.release(holder)
    assert await wait is None and queue.holds(ticket)
    assert far.started == 1


async def test_the_overflow_waits_its_turn_then_starts_once() -> None:
    queue, holder = queue_with_holder()
    _, ticket = queue.request(FG)
    far = Far(delay=10, after=0.1)
    wait = asyncio.create_task(queue.wait(ticket, deadline(5), far.attempt()))
    await asyncio.sleep(0.05)
    assert far.started == 0
    await asyncio.sleep(0.15)
    assert far.started == 1
    queue.release(holder)
    assert await wait is None
    await asyncio.sleep(0)  # the cancelled attempt runs to its end
    assert far.cancelled


async def test_a_full_queue_has_only_the_overflow_or_nothing() -> None:
    queue, _ = queue_with_holder(max_queue=0)
    admission, ticket = queue.request(FG)
    assert (admission, ticket) == (Admission.REJECTED_QUEUE_FULL, 0)
    assert await queue.wait(ticket, deadline(5), None) is None
    far = Far(delay=0.01)
    answered = await queue.wait(ticket, deadline(5), far.attempt())
    assert answered is not None and books(queue) == (1, 0, 0)
    failing = Far(delay=0.01, answers=False)
    assert await queue.wait(ticket, deadline(5), failing.attempt()) is None


@pytest.mark.parametrize("with_overflow", [False, True])
async def test_the_deadline_leaves_the_queue(with_overflow: bool) -> None:
    queue, holder = queue_with_holder()
    _, ticket = queue.request(FG)
    far = Far(delay=10)
    with pytest.raises(TimeoutError):
        await queue.wait(ticket, deadline(0.1), far.attempt() if with_overflow else None)
    assert books(queue) == (1, 0, 0)
    await asyncio.sleep(0)  # the cancelled attempt runs to its end
    assert (far.timeouts, far.cancelled) == ((1, True) if with_overflow else (0, False))
    queue.release(holder)
    assert books(queue) == (0, 0, 0)


async def test_a_waiter_cancelled_as_its_slot_is_granted_passes_the_slot_on() -> None:
    queue, holder = queue_with_holder()
    _, first = queue.request(FG)
    _, second = queue.request(FG)
    waits = [asyncio.create_task(queue.wait(t, deadline(5), None)) for t in (first, second)]
    await asyncio.sleep(0.01)
    queue.release(holder)  # granted to `first`, whose caller leaves in the same instant
    waits[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waits[0]
    assert await waits[1] is None and queue.holds(second)
    assert books(queue) == (1, 0, 0)


async def test_an_overflow_answer_arriving_with_the_slot_is_closed() -> None:
    queue, holder = queue_with_holder()
    _, ticket = queue.request(FG)
    # The slot frees in the very step the overflow's answer lands: both are
    # done when the race looks. The slot wins; the answer is closed, not leaked.
    far = Far(delay=0.01, on_answer=lambda: queue.release(holder))
    assert await queue.wait(ticket, deadline(5), far.attempt()) is None
    assert queue.holds(ticket) and books(queue) == (1, 0, 0)
    assert len(far.sent) == 1 and far.sent[0].closed
