"""Overflow spend, bounded per caller. Pure.

Each overflow attempt of a caller (a key's caller; all callers without a key
share one account, since their names are only claimed) takes one request of
its budget: at most `Budget.requests` attempts in any `Budget.seconds` window
(a sliding window: the times of the attempts in it). A caller past its budget
does not overflow: its request waits for a local slot, and a request that then
finds none (queue full, deadline) is told the budget is spent.

Memory: one window per account (keys are at most `keys.MAX_KEYS`, plus one),
each holding at most `requests` times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localmodel.gateway.keys import Budget

KEYLESS = ""  # the one account of every caller without a key


@dataclass
class Budgets:
    """Keeps each account's overflow requests in its window, and decides whether one more is within
    budget."""

    default: Budget | None  # --overflow-budget; None: unbounded
    _windows: dict[str, deque[float]] = field(default_factory=dict)

    def take(self, account: str, budget: Budget | None, now: float) -> bool:
        """Spend one request of `account`'s budget (None: the default) if it
        has one left in the window ending now; False when spent."""
        budget = budget if budget is not None else self.default
        if budget is None:
            return True
        window = self._windows.setdefault(account, deque())
        while window and window[0] <= now - budget.seconds:
            window.popleft()
        if len(window) >= budget.requests:
            return False
        window.append(now)
        return True

    def limit(self, budget: Budget | None) -> Budget | None:
        return budget if budget is not None else self.default
