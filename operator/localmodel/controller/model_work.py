"""One model's share of a pass (`ModelWork`: what to write and the status to
report), worked out by `model_work` from its result, the watches' view and its
speeds, and a pass's plan (`PassPlan`: every model's share, where each replica
goes, the replicas whose speed is read). Pure; this is the plain step that
`work_memo.KeptWork` keeps between passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localmodel.api import LocalModelStatus
from localmodel.controller.changes import ModelChanges, model_changes
from localmodel.controller.clock import rfc3339
from localmodel.controller.gaps import gap_of
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed
from localmodel.controller.speed import SpeedTarget, speed_targets
from localmodel.desired import ModelResult
from localmodel.gaps import with_gap
from localmodel.idle.wakers import NO_OUTCOME, IdleOutcome
from localmodel.idle_status import IdleReport, with_idle
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import with_progress, with_speed


@dataclass(frozen=True)
class ModelWork:
    """One model's share of a pass: what to write, and the status to report."""

    model: ModelObject
    changes: ModelChanges
    status: LocalModelStatus
    failure: str = ""  # computing it raised (stage and exception): nothing changes


@dataclass(frozen=True)
class PassPlan:
    """A pass's plan: every model's share, where each replica goes, the replicas to read."""

    work: list[ModelWork]
    placed: dict[str, dict[int, str]]  # where this pass puts every replica
    speed_targets: tuple[SpeedTarget, ...] = ()  # Ready replicas whose gateway can be read
    # The idle decisions for the shell (idle/wakers.py): the closes to send, the
    # closes to keep renewing, when to look again.
    idle: IdleOutcome = NO_OUTCOME
    # What the reconciler need not look at again: this plan's number, and (the
    # number of the plan it follows, each model whose work is not that plan's
    # very object); None: any model's may differ. (Not compared: a fresh pass
    # gives the same work without them.)
    serial: int = field(default=0, compare=False)
    since: tuple[int, dict[str, ModelWork]] | None = field(default=None, compare=False)


def took_clock(w: ModelWork) -> bool:
    """Whether the status took the clock: a condition whose status is not the
    stored one (`status.took_now`, for any model, valid or not)."""
    if w.model.status is None:
        return bool(w.status.conditions)
    previous = {c.type: c.status for c in w.model.status.conditions}
    return any(previous.get(c.type) != c.status for c in w.status.conditions)


def model_work(result: ModelResult, mo: ModelObject, obs: Observed, now: str,
                published: Mapping[int, Published], policy: SpeedPolicy, own_image: str,
                pull_secrets: Sequence[str] = (), report: IdleReport | None = None,
                ) -> tuple[ModelWork, list[SpeedTarget]]:
    """One valid model's changes and status (progress, the cluster's gaps,
    speed and its idle state added: `report`, of a model with `spec.idle`),
    and its replicas to read."""
    changes = model_changes(result, mo.uid, obs, report.idle if report is not None else None)
    status = with_progress(result.status, changes.rolling, result.model, now)
    status = with_gap(status, gap_of(result.model, mo.uid, obs, pull_secrets),
                      result.model, now)  # the cluster's own gaps, said up front
    status = with_speed(status, {replica: (p, rfc3339(p.measured_at))
                                 for replica, p in published.items()},
                        policy, result.model, now)
    status = with_idle(status, report, result.model, now)
    if status == mo.status:  # settled: the stored status itself, not a second copy of it
        status = mo.status
    return ModelWork(mo, changes, status), speed_targets(result, obs, own_image)


Worked = tuple[ModelWork, list[SpeedTarget]]  # a model's share, its replicas to read
