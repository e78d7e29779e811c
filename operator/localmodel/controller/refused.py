"""What a refused write means: an API error read by its HTTP code, `reason`
and `details.causes` (never its message text), and whether the write is worth a
retry or a report. Pure; tests/controller/test_policy.py holds it as a table.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from localmodel.controller.changes import Change, Create, Delete

# metav1.StatusCause `reason` of the NamespaceLifecycle admission's refusal.
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class Refusal(Enum):
    """What an API error says of a write (by its code and causes)."""

    NOT_FOUND = "not found"  # 404
    CONFLICT = "conflict"  # 409: already exists, or the uid precondition failed
    NAMESPACE_ENDING = "namespace ending"  # 403: the namespace is being deleted
    OTHER = "other"


def refusal(code: int, causes: Collection[str] = ()) -> Refusal:
    """What an API error says, from its code and its `details.causes` reasons."""
    if code == 404:
        return Refusal.NOT_FOUND
    if code == 409:
        return Refusal.CONFLICT
    if code == 403 and NAMESPACE_TERMINATING_CAUSE in causes:
        return Refusal.NAMESPACE_ENDING
    return Refusal.OTHER


def settled(change: Change, why: Refusal) -> bool:
    """Whether a refused change needs no retry and no report: already gone or
    already there (the next pass sees it), or the namespace (and the model in
    it) is being deleted."""
    if why is Refusal.NAMESPACE_ENDING:
        return True
    return why in (Refusal.NOT_FOUND, Refusal.CONFLICT) and isinstance(change, Delete | Create)


def status_settled(why: Refusal) -> bool:
    """A status write refused because the model or its namespace is going."""
    return why in (Refusal.NOT_FOUND, Refusal.NAMESPACE_ENDING)


def event_settled(why: Refusal) -> bool:
    """An Event refused because its namespace is going: nothing to report."""
    return why is Refusal.NAMESPACE_ENDING
