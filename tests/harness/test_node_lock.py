"""The machine's one real node is an flock: a second harness queues, or fails at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.harness.realnode import WAIT_ENV, NodeLock, RealNodeError

pytestmark = pytest.mark.unit


def test_a_second_holder_is_refused_without_a_wait(tmp_path: Path) -> None:
    first, second = NodeLock(tmp_path / "lock"), NodeLock(tmp_path / "lock")
    assert first.acquire(wait=0)
    try:
        assert not second.acquire(wait=0)
        assert (tmp_path / "lock").read_text().strip().isdigit()  # the holder's pid
    finally:
        first.release()
    assert second.acquire(wait=0)  # released: free again
    second.release()


def test_a_waiting_holder_gets_the_node_when_it_is_released(tmp_path: Path) -> None:
    first, second = NodeLock(tmp_path / "lock"), NodeLock(tmp_path / "lock")
    assert first.acquire(wait=0)
    timer = threading.Timer(0.5, first.release)
    timer.start()
    began = time.monotonic()
    try:
        assert second.acquire(wait=30)
    finally:
        timer.join()
        second.release()
    assert 0.4 < time.monotonic() - began < 10


def test_the_wait_comes_from_the_environment(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = NodeLock(tmp_path / "lock"), NodeLock(tmp_path / "lock")
    assert first.acquire(wait=0)
    try:
        monkeypatch.setenv(WAIT_ENV, "soon")
        with pytest.raises(RealNodeError, match=WAIT_ENV):
            second.acquire()
        monkeypatch.setenv(WAIT_ENV, "0")
        assert not second.acquire()
    finally:
        first.release()
