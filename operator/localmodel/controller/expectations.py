"""What this replica wrote and the watches have not shown yet (`Expectations`),
so a pass that starts before the watch event arrives does not write it again.
Pure; tests/controller/test_policy.py holds it as a table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from localmodel.contract import ANNOTATION_APPLIED_HASH
from localmodel.controller.changes import Apply, Change, Create, Delete, Target
from localmodel.controller.observed import Observed

# A write is expected to show in the watches within this long; after that the
# next pass acts on what it sees, whatever was written before.
EXPECT_SECONDS = 30.0


class Wrote(Enum):
    """What this replica did to an object."""

    CREATED = "created"
    DELETED = "deleted"
    APPLIED = "applied"


@dataclass(frozen=True)
class Expectation:
    """What this replica wrote to one object, until when to wait for the watch."""

    wrote: Wrote
    until: float
    digest: str = ""  # APPLIED: the applied manifest's hash
    owner: str = ""  # CREATED: the uid of the model it was made for


def applied_digest(change: Create | Apply) -> str:
    """The hash an applied object carries (else the manifest itself, as text)."""
    annotations = change.manifest["metadata"].get("annotations") or {}
    return str(annotations.get(ANNOTATION_APPLIED_HASH, "")) or json.dumps(
        change.manifest, sort_keys=True)


def owner_uid(manifest: Mapping[str, Any]) -> str:
    """The uid of the object's first owner (the model it is made for), or ""."""
    refs = manifest.get("metadata", {}).get("ownerReferences") or []
    return str(refs[0].get("uid", "")) if refs else ""


def expectation(change: Change, now: float) -> Expectation:
    until = now + EXPECT_SECONDS
    if isinstance(change, Delete):
        return Expectation(Wrote.DELETED, until)
    if isinstance(change, Create):
        return Expectation(Wrote.CREATED, until, owner=owner_uid(change.manifest))
    return Expectation(Wrote.APPLIED, until, applied_digest(change))


class Lag(Enum):
    """How a change stands against what was written to its object before."""

    WAIT = "wait"  # written, the watches lag behind: do not write it again
    CAUGHT_UP = "caught up"  # the watches show it (or waited long enough): forget it
    OTHER = "other"  # a different write: make it, keep the expectation


def present(obs: Observed, target: Target) -> bool:
    kind, ns, name = target
    if kind == "Pod":  # a replica's, or a doorman
        return (ns, name) in obs.pods or (ns, name) in obs.doormen
    if kind == "PersistentVolumeClaim":
        return (ns, name) in obs.claims
    if kind in ("ConfigMap", "Service", "NetworkPolicy"):
        return target in obs.objects
    return False


def shown(expected: Expectation, target: Target, obs: Observed, now: float) -> bool:
    """Whether the watches show the write (or it was waited for long enough)."""
    if now > expected.until:
        return True
    if expected.wrote is Wrote.APPLIED:
        have = obs.objects.get(target)
        return have is not None and have.applied_hash == expected.digest
    return present(obs, target) is (expected.wrote is Wrote.CREATED)


def lag(expected: Expectation, change: Change, obs: Observed, now: float) -> Lag:
    if shown(expected, change.target, obs, now):
        return Lag.CAUGHT_UP
    if expected.wrote is Wrote.APPLIED:
        same = not isinstance(change, Delete) and applied_digest(change) == expected.digest
        return Lag.WAIT if same else Lag.OTHER
    if isinstance(change, Create) and expected.owner != owner_uid(change.manifest):
        # Made for an earlier model of the same name (deleted, its objects
        # collected, before the watches showed them): this one needs its own.
        return Lag.OTHER
    wrote = Wrote.DELETED if isinstance(change, Delete) else Wrote.CREATED
    return Lag.WAIT if expected.wrote is wrote else Lag.OTHER


@dataclass
class Expectations:
    """This replica's writes the watches have not shown yet (controller-runtime's
    idea): without them a pass that starts before the watch event of an earlier
    write arrives would repeat it (a 409 create, a second delete)."""

    by_target: dict[Target, Expectation] = field(default_factory=dict)

    def waiting(self, change: Change, obs: Observed, now: float) -> bool:
        """Whether `change` was already made and the watches lag behind."""
        expected = self.by_target.get(change.target)
        if expected is None:
            return False
        state = lag(expected, change, obs, now)
        if state is Lag.CAUGHT_UP:
            del self.by_target[change.target]
        return state is Lag.WAIT

    def wrote(self, change: Change, now: float) -> None:
        self.by_target[change.target] = expectation(change, now)

    def forget_shown(self, obs: Observed, now: float) -> None:
        """Forget every write the watches show, whether or not a change is wanted
        for its object now: a pod created, seen, then deleted by someone else
        within EXPECT_SECONDS is a pod to create, not a create the watches lag on."""
        self.by_target = {target: expected for target, expected in self.by_target.items()
                          if not shown(expected, target, obs, now)}
