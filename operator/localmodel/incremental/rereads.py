"""Which models a pass must work out again (`Rereads`): what the last pass's
results read, compared with this pass's inputs."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from localmodel.desired import ClaimChooser
from localmodel.planner import Plan
from localmodel.render import RenderOptions


class PassInputs(NamedTuple):
    """One call's inputs, as the models' steps read them."""

    plan: Plan
    # Whether a kept result still holds for the plan: the same plan, or a
    # model the planner did not touch (None: it may have touched any).
    plan_same: bool
    touched: frozenset[str] | None
    ready: Mapping[str, Mapping[int, bool]] | None
    options: RenderOptions | None
    now: str
    claims: ClaimChooser | None
    claims_again: Collection[str] | None  # the models `claims` may answer differently


class Rereads:
    """Keeps what the last pass's results read (the plan, the options,
    readiness, the clock for the statuses that took it, whether claims were
    chosen, which models failed), and decides which models a new pass looks
    at again: those whose reads changed (None: every model)."""

    def __init__(self) -> None:
        self.took_now: set[str] = set()  # models whose status took the clock
        self.failed: set[str] = set()  # models whose last result failed: computed again
        self._plan: Plan | None = None
        self._options: RenderOptions | None = None
        self._ready: dict[str, dict[int, bool]] | None = None
        self._now: str | None = None
        self._claims = False

    def planned(
        self, the_plan: Plan, touched: frozenset[str] | None, again: set[str] | None
    ) -> tuple[bool, frozenset[str] | None, set[str] | None]:
        """Whether the plan is the last one, the models the planner touched
        (``touched``: the planner's word for its last call), and the models to
        look at again. The planner hands back the same plan only when no
        node's facts changed, and names the models a new plan may place or
        explain differently (the nodes of the others were not re-kept: their
        facts are the same too)."""
        plan_same = the_plan is self._plan
        touched = touched if self._plan is not None else None
        if not plan_same:
            if touched is None:
                again = None
            elif again is not None:
                again |= touched
        self._plan = the_plan
        return plan_same, touched, again

    def again(self, again: set[str] | None, now: PassInputs) -> set[str] | None:
        """The models whose results read what changed since the last pass: the
        options, whether claims are chosen, readiness, the clock; and those
        that failed."""
        if now.options != self._options or ((bool(now.claims) or self._claims) and not (
                now.claims and self._claims and now.claims_again is not None)):
            again = None  # (claims: a function, asked again for every replica)
        elif now.claims and again is not None:
            again |= set(now.claims_again or ())
        self._options, self._claims = now.options, now.claims is not None
        ready = now.ready
        if ready != self._ready:  # (None, or a mapping compared in C)
            if again is not None:
                if (ready is None) != (self._ready is None):
                    again = None
                else:
                    old, new = self._ready or {}, ready or {}
                    again |= {
                        k for k in old.keys() | new.keys() if old.get(k, {}) != new.get(k, {})
                    }
            self._ready = None if ready is None else {k: dict(v) for k, v in ready.items()}
        if now.now != self._now:
            if again is not None:
                again |= self.took_now
            self._now = now.now
        return None if again is None else again | self.failed

    def forget(self, keys: Collection[str]) -> None:
        """Models no longer listed."""
        self.took_now.difference_update(keys)
        self.failed.difference_update(keys)
