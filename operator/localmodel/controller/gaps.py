"""A model's pods and claims, as the watches hold them, read for the cluster's
gaps (localmodel/gaps.py decides). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from localmodel.api import LocalModel
from localmodel.controller.observed import Observed
from localmodel.gaps import ClaimState, Gap, PodState, model_gap


def gap_of(lm: LocalModel, uid: str, obs: Observed, pull_secrets: Sequence[str]) -> Gap | None:
    """The gap of the model whose stored uid is `uid`: its live pods and its
    claims, against the StorageClasses the watch holds."""
    pods = [
        PodState(p.replica, p.name, p.ready, p.image_waits,
                 p.unschedulable_message if (p.unschedulable_since or p.unschedulable_message)
                 else None, p.failing)
        for p in obs.pods_of(lm.key) if p.owner_uid == uid and not p.terminating
    ]
    claims = [ClaimState(c.name, c.storage_class, c.volume is not None)
              for c in obs.claims_of(lm.key) if not c.terminating]
    return model_gap(lm.metadata.namespace, pods, claims, obs.storage_classes, pull_secrets)
