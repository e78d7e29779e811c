"""What the operator posts about a model: the core/v1 Event for an `EventSpec`
(`event_manifest`), and for its failed writes the growing wait before a retry
and one Warning per change of what failed (`Failures`). Pure;
tests/controller/test_policy.py holds it as a table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from localmodel import API_VERSION, KIND
from localmodel.contract import EVENT_REPORTING_COMPONENT, EVENT_SOURCE_COMPONENT
from localmodel.events import EventReason, EventSpec

# A change that failed is tried again after this long (growing per failure).
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)


def retry_after(failures: int) -> float:
    """The wait before the next try, after `failures` failed ones in a row."""
    return RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]


@dataclass(frozen=True)
class Involved:
    """The LocalModel an Event is about."""

    namespace: str
    name: str
    uid: str


def event_manifest(about: Involved, event: EventSpec, now: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about a LocalModel, reported by this replica (`instance`)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": about.name,
                           "namespace": about.namespace, "uid": about.uid},
        "reason": event.reason.value,
        "message": event.message[:1024],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": EVENT_SOURCE_COMPONENT},
        "reportingComponent": EVENT_REPORTING_COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def failure_event(failed: Iterable[str]) -> EventSpec:
    """One Warning for a pass's failed writes to one model."""
    return EventSpec(EventReason.FAILED, "; ".join(sorted(set(failed)))[:1000], warning=True)


@dataclass
class Failures:
    """Failed writes per model across passes: when to try again (growing waits),
    and an Event only when what failed changed."""

    in_a_row: dict[str, int] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)  # model -> the message posted

    def after_pass(self, model: str, failed: Sequence[str]
                   ) -> tuple[float | None, EventSpec | None]:
        """(retry in seconds, Event to post) for `model`'s failed writes of a pass."""
        if not failed:
            self.in_a_row.pop(model, None)
            self.reported.pop(model, None)
            return None, None
        n = self.in_a_row.get(model, 0)
        self.in_a_row[model] = n + 1
        event = failure_event(failed)
        if self.reported.get(model) == event.message:
            return retry_after(n), None
        self.reported[model] = event.message
        return retry_after(n), event
