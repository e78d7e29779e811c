"""Each model's share of a pass, kept between passes while what it read holds. Pure.

`policy.plan_pass` works out, per valid model, its changes (`changes.py`), its
status (progress and speed added) and the replicas whose speed can be read.
That reads the model's result (from `incremental.Desired`, which hands back
the same object while the model's inputs hold), the model as stored, what the
watches show of its own objects (pods, claims, ConfigMaps, Services,
NetworkPolicies, by label, by owner and by the names the result gives them),
the nodes its pods and replicas are on, its published speeds and the clock.
`KeptWork` keeps what was worked out with all of that, and gives it back while
every piece is the same: the same objects (all frozen; `observe` hands back
the same ones for objects that did not change), or equal values. The clock
counts only when the status took it (`status.took_now`: a condition moved).

So a pass after one event works out again only the models that event touched,
and a quiet pass (the same `Observed`, the same results) none.
tests/unit/test_pass_incremental.py holds a pass with a long-lived `KeptWork`
equal to one without, over random sequences of events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from localmodel.controller.observed import Observed
from localmodel.controller.speed import SpeedTarget
from localmodel.desired import ModelResult
from localmodel.render import replica_claim
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import took_now

Worked = tuple[Any, list[SpeedTarget]]  # (the model's ModelWork, its replicas to read)


class _Kept(NamedTuple):
    result: ModelResult
    obs: Observed  # the `Observed` it was last found valid for
    published: Mapping[int, Published]
    policy: SpeedPolicy
    own_image: str
    now: str
    took_now: bool  # whether its status took the clock
    reads: tuple[Any, ...]  # what it read of `obs` (`reads`)
    worked: Worked


def reads(result: ModelResult, uid: str, obs: Observed) -> tuple[Any, ...]:
    """Everything of `obs` one model's changes, status and speed targets read:
    its pods and claims (by label), the claims and applied objects named by
    its result, the objects it owns, and the nodes of its pods and replicas."""
    lm = result.model
    ns, key = lm.metadata.namespace, lm.key
    pods = obs.pods_of(key)
    return (
        obs.models.get(key),
        pods,
        obs.claims_of(key),
        tuple(obs.claims.get((ns, replica_claim(lm, r))) for r in result.replicas),
        tuple(obs.objects.get((kind, ns, name)) for kind, name in result.applied_hashes),
        obs.objects_owned(ns, uid),
        tuple(obs.nodes.get(p.node or "") for p in pods),
        tuple(obs.nodes.get(r.node) for r in result.replicas),
    )


@dataclass
class KeptWork:
    """The reconciler's memory of each valid model's share of the last passes."""

    by_model: dict[str, _Kept] = field(default_factory=dict)

    def work(self, result: ModelResult, uid: str, obs: Observed, now: str,
             published: Mapping[int, Published], policy: SpeedPolicy, own_image: str,
             compute: Callable[[], Worked], status_of: Callable[[Worked], Any]) -> Worked:
        """The model's share: kept, or `compute`d (and kept unless it raised).
        `status_of` gives the status of a share (to know whether it took `now`)."""
        key = result.model.key
        kept = self.by_model.get(key)
        if (kept is not None and kept.result is result and kept.policy == policy
                and kept.own_image == own_image and (kept.now == now or not kept.took_now)
                and kept.published == published):
            if kept.obs is obs:
                return kept.worked
            read = reads(result, uid, obs)
            if read == kept.reads:
                self.by_model[key] = kept._replace(obs=obs)
                return kept.worked
        else:
            read = reads(result, uid, obs)
        self.by_model.pop(key, None)
        worked = compute()
        self.by_model[key] = _Kept(result, obs, published, policy, own_image, now,
                                   took_now(result.model, status_of(worked)), read, worked)
        return worked

    def keep_only(self, keys: set[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        for key in [k for k in self.by_model if k not in keys]:
            del self.by_model[key]


@dataclass
class ConditionTally:
    """LocalModels by condition and status (the operator's gauge), kept up to
    date with what changed: a status is counted again only when it is another
    object than the one counted for its model."""

    counted: dict[str, tuple[Any, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    totals: dict[tuple[str, ...], float] = field(default_factory=dict)

    def count(self, statuses: Mapping[str, Any]) -> dict[tuple[str, ...], float]:
        """The tally for `statuses` (model -> LocalModelStatus), as a new dict."""
        before, now = self.counted, {}
        for key, status in statuses.items():
            kept = before.pop(key, None)
            if kept is None or kept[0] is not status:
                if kept is not None:
                    self._add(kept[1], -1)
                kept = (status, tuple((c.type, c.status.value) for c in status.conditions))
                self._add(kept[1], 1)
            now[key] = kept
        for _, pairs in before.values():  # models gone
            self._add(pairs, -1)
        self.counted = now
        return {k: v for k, v in self.totals.items() if v}

    def _add(self, pairs: tuple[tuple[str, str], ...], n: int) -> None:
        for pair in pairs:
            self.totals[pair] = self.totals.get(pair, 0) + n
