"""Slot and queue accounting: tables for the rules, a state machine for the invariants."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from localmodel.gateway.slots import (
    Admission,
    Priority,
    SlotBoard,
    parse_priority,
    retry_after_seconds,
)

FG, BG = Priority.FOREGROUND, Priority.BACKGROUND


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, FG), ("", FG), ("background", BG), (" Background ", BG), ("high", FG), ("low", FG)],
)
def test_priority_header(header: str | None, expected: Priority) -> None:
    assert parse_priority(header) is expected


def test_background_is_admitted_only_when_a_slot_is_free_and_never_queued() -> None:
    board = SlotBoard(total=1, queue_limit=4)
    assert board.request(BG)[0] is Admission.ADMITTED
    assert board.request(BG) == (Admission.REJECTED_BUSY, 0)
    assert board.snapshot().queued == 0


def test_foreground_queues_up_to_the_limit_then_is_rejected() -> None:
    board = SlotBoard(total=1, queue_limit=2)
    assert board.request(FG)[0] is Admission.ADMITTED
    assert board.request(FG)[0] is Admission.QUEUED
    assert board.request(FG)[0] is Admission.QUEUED
    assert board.request(FG) == (Admission.REJECTED_QUEUE_FULL, 0)
    snap = board.snapshot()
    assert (snap.busy, snap.queued_foreground, snap.free) == (1, 2, 0)


def test_freed_slot_goes_to_the_head_of_the_foreground_queue_in_order() -> None:
    board = SlotBoard(total=1, queue_limit=8)
    _, holder = board.request(FG)
    queued = [board.request(FG)[1] for _ in range(3)]
    # A background request arriving now cannot take the slot from the queue.
    assert board.request(BG)[0] is Admission.REJECTED_BUSY
    granted = []
    current = holder
    for _ in queued:
        nxt = board.release(current)
        assert nxt is not None
        granted.append(nxt)
        current = nxt
    assert granted == queued
    assert board.release(current) is None
    assert board.snapshot().busy == 0


def test_withdraw_removes_a_waiter_but_not_a_holder() -> None:
    board = SlotBoard(total=1, queue_limit=8)
    _, holder = board.request(FG)
    _, a = board.request(FG)
    _, b = board.request(FG)
    assert board.withdraw(a) is True
    assert board.position(b) == 0
    assert board.release(holder) == b
    assert board.withdraw(b) is False  # already granted: the caller must release it
    assert board.holds(b)


def test_zero_queue_limit_rejects_foreground_at_once() -> None:
    board = SlotBoard(total=1, queue_limit=0)
    board.request(FG)
    assert board.request(FG)[0] is Admission.REJECTED_QUEUE_FULL


@pytest.mark.parametrize(
    ("mean", "queued", "slots", "expected"),
    [
        (0.0, 0, 1, 1),  # nothing known yet
        (2.5, 0, 1, 3),
        (10.0, 3, 2, 20),
        (1000.0, 10, 1, 120),  # capped
        (float("nan"), 1, 1, 1),
    ],
)
def test_retry_after_estimates_one_slot_wait(
    mean: float, queued: int, slots: int, expected: int
) -> None:
    assert retry_after_seconds(mean, queued, slots) == expected


def test_a_request_being_read_holds_its_place_so_a_full_queue_refuses_the_next_unread() -> None:
    board = SlotBoard(total=1, queue_limit=2)
    assert [board.reserve(FG) for _ in range(3)] == [Admission.QUEUED] * 3
    assert board.reserve(FG) is Admission.REJECTED_QUEUE_FULL
    assert board.reserve(BG) is Admission.REJECTED_BUSY
    assert board.request(FG) == (Admission.REJECTED_QUEUE_FULL, 0)  # no place to take
    # Each counted request, once parsed, gets the place it held.
    assert [board.request(FG, reserved=True)[0] for _ in range(3)] == [
        Admission.ADMITTED, Admission.QUEUED, Admission.QUEUED,
    ]
    assert board.reserved == 0


def test_a_background_request_is_refused_unread_when_every_slot_is_spoken_for() -> None:
    board = SlotBoard(total=2, queue_limit=4)
    assert board.reserve(BG) is Admission.QUEUED
    assert board.reserve(FG) is Admission.QUEUED
    assert board.reserve(BG) is Admission.REJECTED_BUSY
    board.unreserve()  # one of them ended unparsed (a bad body): its place is free again
    assert board.reserve(BG) is Admission.QUEUED


def test_unreserving_more_than_was_reserved_is_a_bug() -> None:
    with pytest.raises(ValueError, match="no place"):
        SlotBoard(total=1, queue_limit=1).unreserve()


class BoardMachine(RuleBasedStateMachine):
    """Random arrivals (counted before their bodies are read, or not), reads
    that end parsed or refused, releases and withdrawals keep the books exact."""

    def __init__(self) -> None:
        super().__init__()
        self.board = SlotBoard(total=2, queue_limit=3)
        self.holders: list[int] = []
        self.waiting: list[int] = []  # model FIFO
        self.reading: list[Priority] = []  # counted, body still being read

    def _counted(self) -> int:
        return len(self.holders) + len(self.waiting) + len(self.reading)

    def _granted(self, priority: Priority, admission: Admission, ticket: int) -> None:
        if len(self.holders) < 2 and not self.waiting:
            assert admission is Admission.ADMITTED
            self.holders.append(ticket)
        elif priority is BG:
            assert admission is Admission.REJECTED_BUSY
        else:
            assert admission is Admission.QUEUED
            self.waiting.append(ticket)

    @rule(background=st.booleans())
    def arrive(self, background: bool) -> None:
        priority = BG if background else FG
        counted = self._counted()
        admission, ticket = self.board.request(priority)
        if background and counted >= 2:
            assert admission is Admission.REJECTED_BUSY
        elif counted >= 5:
            assert admission is Admission.REJECTED_QUEUE_FULL
        else:
            self._granted(priority, admission, ticket)

    @rule(background=st.booleans())
    def arrive_unread(self, background: bool) -> None:
        priority = BG if background else FG
        counted = self._counted()
        admission = self.board.reserve(priority)
        if background and counted >= 2:
            assert admission is Admission.REJECTED_BUSY
        elif counted >= 5:
            assert admission is Admission.REJECTED_QUEUE_FULL
        else:
            assert admission is Admission.QUEUED
            self.reading.append(priority)

    @precondition(lambda self: self.reading)
    @rule(data=st.data(), parsed=st.booleans())
    def body_read(self, data: st.DataObject, parsed: bool) -> None:
        priority = self.reading.pop(data.draw(st.integers(0, len(self.reading) - 1)))
        if not parsed:
            self.board.unreserve()
            return
        admission, ticket = self.board.request(priority, reserved=True)
        self._granted(priority, admission, ticket)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(self.holders))
        self.holders.remove(ticket)
        granted = self.board.release(ticket)
        if self.waiting:
            assert granted == self.waiting.pop(0)  # strict FIFO
            self.holders.append(granted)
        else:
            assert granted is None

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(self.waiting))
        assert self.board.withdraw(ticket) is True
        self.waiting.remove(ticket)

    @invariant()
    def books_match(self) -> None:
        snap = self.board.snapshot()
        assert snap.busy == len(self.holders) <= snap.total
        assert snap.queued_foreground == len(self.waiting) <= snap.queue_limit
        assert snap.queued_background == 0
        assert self.board.reserved == len(self.reading)
        # Counted requests never pass the slots and the queue.
        assert self._counted() <= snap.total + snap.queue_limit
        # Nobody waits while a slot is free.
        assert not (snap.free > 0 and snap.queued > 0)


TestBoardMachine = BoardMachine.TestCase
TestBoardMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
