"""The memo layers of a pass's plan, composed (`KeptWork`): what the reconciler
keeps between passes so `plan.plan_pass` costs what changed. Pure.

Each layer saves one step of the plain path (`plan_pass` with a fresh
`KeptWork`), keyed on what that step reads, and all read one answer to what
changed since the last pass (`since.Since`):

* the admin's policy (`admitted`, `tenancy.refusals`): `admit_memo.AdmitMemo`,
  keyed on the models section, the policy and the Secrets' labels, and on each
  model object;
* where replicas are (`with_memory`): `placement_memo.CurrentMemo`, keyed on
  the current placements and the last placements of unplaced replicas' models;
* which claim a replica takes (`changes.choose_claim`):
  `placement_memo.ClaimMemo`, keyed on the model, its claims and pods, the
  node's facts and the claims' volumes;
* each model's share (`model_work.model_work`): `share_memo.ShareMemo`, keyed
  on the model's result, what its share read of the `Observed`, its speeds, its
  idle report and the clock (when its status took it);
* whether any model has `spec.idle` (`IdleMemo`): keyed on the models section,
  so a pass with none skips the idle decisions and keeps its quiet-pass reuse.

tests/controller/test_pass_incremental.py holds a pass with a long-lived `KeptWork`
equal to one without, over random sequences of events.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from localmodel.controller.admit_memo import AdmitMemo
from localmodel.controller.observed import Observed
from localmodel.controller.placement_memo import ClaimMemo, CurrentMemo
from localmodel.controller.share_memo import ShareMemo
from localmodel.controller.since import Since


@dataclass
class IdleMemo:
    """Whether any parsed model has `spec.idle`, kept while the models section
    is the very same object (the plain answer: `any_idle` on a fresh memo)."""

    models: Mapping[str, object] | None = None
    found: bool = False

    def any_idle(self, obs: Observed) -> bool:
        if obs.models is not self.models:
            self.models = obs.models
            self.found = any(m.model is not None and m.model.spec.idle is not None
                             for m in obs.models.values())
        return self.found


@dataclass
class KeptWork:
    """Keeps the operator's plan of the last pass, one memo per step (share,
    admit, placements, claims), each keyed on what its step read since the
    last pass (`since.Since`)."""

    since: Since = field(default_factory=Since)
    shares: ShareMemo = field(init=False)
    admits: AdmitMemo = field(init=False)
    current: CurrentMemo = field(init=False)
    claims: ClaimMemo = field(init=False)
    idle: IdleMemo = field(default_factory=IdleMemo)

    def __post_init__(self) -> None:
        since = self.since
        self.shares, self.admits = ShareMemo(since), AdmitMemo(since)
        self.current, self.claims = CurrentMemo(since), ClaimMemo(since)

    def begin(self, obs: Observed) -> None:
        """A new pass on `obs`: what changed since the last one, for every layer."""
        before = self.since.begin(obs)
        self.shares.begin()
        self.admits.begin(before)
        self.claims.begin(before)

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        self.shares.keep_only(keys)
        self.admits.keep_only(keys)
        self.claims.keep_only(keys)
