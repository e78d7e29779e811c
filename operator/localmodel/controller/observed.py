"""What one pass sees (`Observed`): the watches' objects read into models,
node facts, the operator's own objects and every node's usage, and the views a
pass takes of them (each replica's node now, its readiness, the pods the
scheduler left Unschedulable), each built once per `Observed`. Pure.

`snapshot.observe` makes one from the watches' `Snapshot`; one object at a time
is read by `objects.py` (which also says how the operator's own objects are
recognised) and `volumes.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import Any, TypeVar

from localmodel.api import LocalModel
from localmodel.controller.clock import epoch
from localmodel.controller.objects import (
    Key,
    ModelObject,
    OwnedClaim,
    OwnedDoorman,
    OwnedObject,
    OwnedPod,
)
from localmodel.controller.stuck import StuckPod
from localmodel.controller.volumes import Volume
from localmodel.facts import NodeFacts
from localmodel.gaps import StorageClasses
from localmodel.planner import Usage

T = TypeVar("T")



# The per-snapshot views of an `Observed`, built on first use, and the
# sections of the snapshot each reads: a pass whose snapshot left those
# sections as they were takes the last pass's view (`snapshot.observe`).
_VIEWS: dict[str, frozenset[str]] = {
    "_pods_by_model": frozenset({"pods"}),
    "_doormen_by_model": frozenset({"pods"}),
    "_claims_by_model": frozenset({"claims"}),
    "_by_owner": frozenset({"objects"}),
    "_placements": frozenset({"models", "pods"}),
    "_ready": frozenset({"models", "pods", "node names"}),
    "_stuck": frozenset({"pods"}),
}


@dataclass
class Observed:
    """The watches' objects of one pass, read; the per-model views built on first use."""

    models: dict[str, ModelObject] = field(default_factory=dict)
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    bad_nodes: dict[str, str] = field(default_factory=dict)
    pods: dict[Key, OwnedPod] = field(default_factory=dict)
    claims: dict[Key, OwnedClaim] = field(default_factory=dict)
    objects: dict[tuple[str, str, str], OwnedObject] = field(default_factory=dict)
    volumes: dict[str, Volume] = field(default_factory=dict)
    usage: dict[str, Usage] = field(default_factory=dict)
    storage_classes: StorageClasses = field(
        default_factory=lambda: StorageClasses(frozenset(), ()))
    # The models' doormen (render/doorman.py): pods of theirs, never replicas
    # (their requests are node usage, as any other pod's).
    doormen: dict[Key, OwnedDoorman] = field(default_factory=dict)

    def valid_models(self) -> list[LocalModel]:
        return [m.model for m in self.models.values() if m.model is not None]

    # Per-model views, built once per snapshot: a pass looks each model up
    # several times, and a scan per lookup would make a pass quadratic. Not
    # compared: they follow from the fields above.
    _pods_by_model: dict[str, list[OwnedPod]] | None = field(
        default=None, repr=False, compare=False)
    _claims_by_model: dict[str, list[OwnedClaim]] | None = field(
        default=None, repr=False, compare=False)
    _doormen_by_model: dict[str, list[OwnedDoorman]] | None = field(
        default=None, repr=False, compare=False)
    _by_owner: dict[tuple[str, str], list[OwnedObject]] | None = field(
        default=None, repr=False, compare=False)
    _placements: dict[str, list[str | None]] | None = field(
        default=None, repr=False, compare=False)
    _ready: dict[str, dict[int, bool]] | None = field(default=None, repr=False, compare=False)
    _stuck: list[StuckPod] | None = field(default=None, repr=False, compare=False)
    # (the nodes of an earlier `Observed`, the names whose facts differ from
    # them): what `observe` found replacing a few nodes' objects, if it did.
    nodes_since: tuple[dict[str, NodeFacts], frozenset[str]] | None = field(
        default=None, repr=False, compare=False)

    def pods_of(self, model: str) -> list[OwnedPod]:
        if self._pods_by_model is None:
            by: dict[str, list[OwnedPod]] = {}
            for p in sorted(self.pods.values(), key=lambda p: (p.replica, p.name)):
                by.setdefault(p.model, []).append(p)
            self._pods_by_model = by
        return self._pods_by_model.get(model, [])

    def doormen_of(self, model: str) -> list[OwnedDoorman]:
        """The model's doorman pods (by its name label; the owner is the caller's to check)."""
        if self._doormen_by_model is None:
            by: dict[str, list[OwnedDoorman]] = {}
            for d in sorted(self.doormen.values(), key=lambda d: d.name):
                by.setdefault(d.model, []).append(d)
            self._doormen_by_model = by
        return self._doormen_by_model.get(model, [])

    def claims_of(self, model: str) -> list[OwnedClaim]:
        if self._claims_by_model is None:
            by: dict[str, list[OwnedClaim]] = {}
            for c in sorted(self.claims.values(), key=lambda c: (c.replica, c.name)):
                by.setdefault(c.model, []).append(c)
            self._claims_by_model = by
        return self._claims_by_model.get(model, [])

    def objects_owned(self, namespace: str, owner_uid: str) -> list[OwnedObject]:
        """The ConfigMaps, Services and NetworkPolicies in `namespace` whose
        controller owner is `owner_uid`, in the order of `objects`."""
        if self._by_owner is None:
            by: dict[tuple[str, str], list[OwnedObject]] = {}
            for obj in self.objects.values():
                by.setdefault((obj.namespace, obj.owner_uid), []).append(obj)
            self._by_owner = by
        return self._by_owner.get((namespace, owner_uid), [])


def changed_keys(was: dict[str, ModelObject], now: dict[str, ModelObject]
                 ) -> frozenset[str] | None:
    """The models whose object is not the same one, when the keys are the same
    ones in the same order (else None)."""
    keys = list(now)
    if keys != list(was):
        return None
    return frozenset(compress(keys, map(is_not, map(was.__getitem__, keys), now.values())))


def current_placements(obs: Observed) -> dict[str, list[str | None]]:
    """Where each replica of each valid model is now: its pod's node, else the
    node its status last recorded (a pod deleted for a roll or lost in a crash).
    Built once per `Observed` (not to be changed by the caller)."""
    if obs._placements is None:
        obs._placements = {key: _placed_now(obs, key, m) for key, m in obs.models.items()
                           if m.model is not None}
    return obs._placements


def _placed_now(obs: Observed, key: str, m: ModelObject) -> list[str | None]:
    assert m.model is not None
    nodes: list[str | None] = [None] * m.model.spec.replicas
    if m.status is not None:
        for p in m.status.placements:
            if 0 <= p.replica < len(nodes):
                nodes[p.replica] = p.node
    for pod in obs.pods_of(key):
        if pod.owner_uid == m.uid and 0 <= pod.replica < len(nodes) and pod.node:
            nodes[pod.replica] = pod.node
    return nodes


def unschedulable(obs: Observed) -> list[StuckPod]:
    """Our pods the scheduler has marked Unschedulable, with the node they were
    placed on and since when (once per `Observed`)."""
    if obs._stuck is not None:
        return obs._stuck
    out = []
    for pod in obs.pods.values():
        if pod.unschedulable_since is None or pod.terminating or pod.node is None:
            continue
        since = epoch(pod.unschedulable_since)
        if since is not None:
            out.append(StuckPod(pod.model, pod.replica, pod.name, pod.node, since,
                                pod.unschedulable_message))
    obs._stuck = sorted(out, key=lambda s: (s.model, s.replica))
    return obs._stuck


def readiness(obs: Observed) -> dict[str, dict[int, bool]]:
    """Whether each replica of each valid model is Ready (once per `Observed`)."""
    if obs._ready is None:
        obs._ready = {key: _ready_now(obs, key, m) for key, m in obs.models.items()
                      if m.model is not None}
    return obs._ready


def _ready_now(obs: Observed, key: str, m: ModelObject) -> dict[int, bool]:
    # A pod on a node that is gone is not serving, whatever it last reported.
    return {p.replica: p.ready and p.node in obs.nodes
            for p in obs.pods_of(key) if p.owner_uid == m.uid}


# The views built model by model: with the same valid models, a few of them
# new objects, the last view with those models' entries made again.
_PER_MODEL: dict[str, Callable[[Observed, str, ModelObject], Any]] = {
    "_placements": _placed_now,
    "_ready": _ready_now,
}


def _patched(one: Callable[[Observed, str, ModelObject], T], obs: Observed,
             kept: dict[str, T], keys: Iterable[str]) -> dict[str, T]:
    out = dict(kept)
    for key in keys:
        m = obs.models[key]
        if m.model is not None:  # (the same valid models: its entry is there)
            out[key] = one(obs, key, m)
    return out


def take_views(obs: Observed, last: Observed, same: set[str],
               since: frozenset[str] | None) -> None:
    """Give `obs` the views of `last` whose sections (`_VIEWS`) are the `same`
    ones, and those built model by model patched for the models `since` names
    while the valid models are the same ones ("valid models" in `same`)."""
    for view, reads in _VIEWS.items():
        if reads <= same:
            setattr(obs, view, getattr(last, view))
        elif (view in _PER_MODEL and reads <= same | {"models"} and "valid models" in same
              and (kept := getattr(last, view)) is not None and since is not None):
            setattr(obs, view, _patched(_PER_MODEL[view], obs, kept, since))
