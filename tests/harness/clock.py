"""A clock a test sets by hand: pass it where code takes `clock=time.monotonic`
(it is called for the time) and, where code also sleeps, its `sleep` moves it."""

from __future__ import annotations


class Clock:
    """The time is `now`; calling it reads `now`, `sleep(s)` adds `s` to it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
