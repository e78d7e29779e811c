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


class BoardMachine(RuleBasedStateMachine):
    """Random arrivals, releases and withdrawals keep the books exact."""

    def __init__(self) -> None:
        super().__init__()
        self.board = SlotBoard(total=2, queue_limit=3)
        self.holders: list[int] = []
        self.waiting: list[int] = []  # model FIFO

    @rule(background=st.booleans())
    def arrive(self, background: bool) -> None:
        priority = BG if background else FG
        admission, ticket = self.board.request(priority)
        free = len(self.holders) < 2 and not self.waiting
        if free:
            assert admission is Admission.ADMITTED
            self.holders.append(ticket)
        elif background:
            assert admission is Admission.REJECTED_BUSY
        elif len(self.waiting) >= 3:
            assert admission is Admission.REJECTED_QUEUE_FULL
        else:
            assert admission is Admission.QUEUED
            self.waiting.append(ticket)

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
        # Nobody waits while a slot is free.
        assert not (snap.free > 0 and snap.queued > 0)


TestBoardMachine = BoardMachine.TestCase
TestBoardMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
