"""What the watches hold, turned into what the planner and the changes need. Pure.

Input is a `Snapshot`: the raw objects (dicts, as the API server returns them)
that the watches keep in memory. Output is an `Observed`: parsed models (or the
field error that stops each one), node facts, the operator's own pods, claims,
ConfigMaps and Services, the volumes claims are bound to, and every other pod's
requests per node. One object at a time is read by `objects.py` (which also
says how the operator's own objects are recognised) and `volumes.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress
from operator import is_not
from typing import Any, TypeVar

from localmodel.api import LocalModel
from localmodel.controller.objects import (
    Key,
    ModelObject,
    OwnedClaim,
    OwnedObject,
    OwnedPod,
    Raw,
    metadata,
    owned_claim,
    owned_object,
    owned_pod,
    parse_model,
)
from localmodel.controller.parsed import Parsed as Parsed  # (re-exported: observe takes one)
from localmodel.controller.parsed import Version, version_of
from localmodel.controller.volumes import Volume, volume
from localmodel.facts import NodeFacts
from localmodel.facts.node import NodeFactsError, from_node
from localmodel.facts.pod import pod_node, pod_requests
from localmodel.gaps import StorageClasses, storage_classes
from localmodel.planner import Usage

T = TypeVar("T")
S = TypeVar("S")


@dataclass(frozen=True)
class Snapshot:
    """Raw objects from the watches, one list per resource."""

    localmodels: Sequence[Raw] = ()
    nodes: Sequence[Raw] = ()
    pods: Sequence[Raw] = ()
    claims: Sequence[Raw] = ()
    volumes: Sequence[Raw] = ()
    configmaps: Sequence[Raw] = ()
    services: Sequence[Raw] = ()
    networkpolicies: Sequence[Raw] = ()
    storageclasses: Sequence[Raw] = ()


# The per-snapshot views of an `Observed`, built on first use, and the
# sections of the snapshot each reads: a pass whose snapshot left those
# sections as they were takes the last pass's view (`observe`).
_VIEWS: dict[str, frozenset[str]] = {
    "_pods_by_model": frozenset({"pods"}),
    "_claims_by_model": frozenset({"claims"}),
    "_by_owner": frozenset({"objects"}),
    "_placements": frozenset({"models", "pods"}),
    "_ready": frozenset({"models", "pods", "node names"}),
    "_stuck": frozenset({"pods"}),
}


@dataclass
class Observed:
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

    def valid_models(self) -> list[LocalModel]:
        return [m.model for m in self.models.values() if m.model is not None]

    # Per-model views, built once per snapshot: a pass looks each model up
    # several times, and a scan per lookup would make a pass quadratic. Not
    # compared: they follow from the fields above.
    _pods_by_model: dict[str, list[OwnedPod]] | None = field(
        default=None, repr=False, compare=False)
    _claims_by_model: dict[str, list[OwnedClaim]] | None = field(
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


def _node_facts(body: Raw) -> NodeFacts | str:
    try:
        return from_node(body)
    except (NodeFactsError, ValueError, TypeError) as exc:
        return str(exc)


def observe(snap: Snapshot, namespaces: Iterable[str] = (), parsed: Parsed | None = None
            ) -> Observed:
    """Parse a snapshot. Never raises because of one bad object. `parsed`: what
    earlier passes read (updated here to this snapshot); without it the same
    result, read afresh. A snapshot whose objects are all the ones the last
    call saw gives the last `Observed` back."""
    watched = frozenset(namespaces)
    memo = parsed if parsed is not None else Parsed()
    same: set[str] = set()

    def take(name: str, bodies: tuple[Sequence[Raw], ...], settings: tuple[Any, ...],
             make: Callable[[], S]) -> S:
        value, kept = memo.section(name, bodies, settings, make)
        if kept:
            same.add(name)
        return value

    models = take("models", (snap.localmodels,), (watched,),
                  lambda: _observe_models(snap.localmodels, watched, memo))
    nodes, bad = take("nodes", (snap.nodes,), (), lambda: _observe_nodes(snap.nodes, memo))
    last = memo.last
    since = None if last is None or last.models is models else changed_keys(last.models, models)
    valid = _valid_uids(models, memo, None if last is None else last.models, since)
    pods, usage = take("pods", (snap.pods,), (watched, valid),
                       lambda: _observe_pods(snap.pods, watched, valid, memo))
    claims = take("claims", (snap.claims,), (watched,),
                  lambda: _observe_claims(snap.claims, watched, memo))
    objects = take("objects", (snap.configmaps, snap.services, snap.networkpolicies),
                   (watched,), lambda: _observe_objects(snap, watched, memo))
    volumes = take("volumes", (snap.volumes,), (),
                   lambda: {v.name: v for v in memo.each("volumes", snap.volumes, volume)})
    classes = take("storage_classes", (snap.storageclasses,), (),
                   lambda: storage_classes(snap.storageclasses))
    if last is not None and len(same) == len(memo.sections):
        return last
    if last is not None and ("nodes" in same or last.nodes.keys() == nodes.keys()):
        same.add("node names")
    obs = Observed(models, nodes, bad, pods, claims, objects, volumes, usage, classes)
    if last is not None and memo.nodes_since is not None and memo.nodes_since[1] is nodes:
        obs.nodes_since = (last.nodes, memo.nodes_since[2]) if memo.nodes_since[0] is (
            last.nodes) else None
    if since is not None and memo.valid is not None and memo.valid[2]:
        # The same valid models (a few new objects): the per-model views of
        # the others are the last ones. (`since` is not kept with `obs`: it
        # would hold the last models, and freeing them all falls to a later pass.)
        same.add("valid models")
    if last is not None:
        for view, reads in _VIEWS.items():
            if reads <= same:
                setattr(obs, view, getattr(last, view))
            elif (view in _PER_MODEL and reads <= same | {"models"} and "valid models" in same
                  and (kept := getattr(last, view)) is not None and since is not None):
                setattr(obs, view, _patched(_PER_MODEL[view], obs, kept, since))
    memo.last = obs
    return obs


def changed_keys(was: dict[str, ModelObject], now: dict[str, ModelObject]
                 ) -> frozenset[str] | None:
    """The models whose object is not the same one, when the keys are the same
    ones in the same order (else None)."""
    keys = list(now)
    if keys != list(was):
        return None
    return frozenset(compress(keys, map(is_not, map(was.__getitem__, keys), now.values())))


def _valid_uids(models: dict[str, ModelObject], memo: Parsed,
                last: dict[str, ModelObject] | None, since: frozenset[str] | None
                ) -> frozenset[str]:
    """The uids of the valid models: the last set (the same object) while the
    models `since` names (those changed since the `last` ones) kept their uid
    and validity (`memo.valid[2]` then says so)."""
    kept = memo.valid
    if kept is not None and kept[0] is models:
        return kept[1]
    if kept is not None and last is not None and kept[0] is last and since is not None and all(
            (was := last[k]).uid == (m := models[k]).uid
            and (was.model is None) == (m.model is None) for k in since):
        memo.valid = (models, kept[1], True)
        return kept[1]
    valid = frozenset(m.uid for m in models.values() if m.model is not None)
    memo.valid = (models, valid, False)
    return valid


MAX_REPLACED = 64  # more objects replaced since the last pass: read the section anew


def _replaced(before: list[Raw], bodies: Sequence[Raw], read: dict[int, tuple[Raw, Any]]
              ) -> list[tuple[int, Any]] | None:
    """Where `bodies` holds another object than `before` (replaced in place), with
    what was read of the one replaced; None past MAX_REPLACED or if it was not read."""
    moved = list(compress(range(len(bodies)), map(is_not, before, bodies)))
    if len(moved) > MAX_REPLACED:
        return None
    found = []
    for i in moved:
        old = read.get(id(before[i]))
        if old is None or old[0] is not before[i]:
            return None
        found.append((i, old[1]))
    return found


def _model_reading(body: Raw, memo: Parsed) -> tuple[Version | None, ModelObject]:
    version = version_of(body)
    m = memo.models.get(version) if version else None
    return version, parse_model(body) if m is None else m


def _models_again(bodies: Sequence[Raw], watched: frozenset[str], memo: Parsed
                  ) -> dict[str, ModelObject] | None:
    """The last models section with the few objects that are not the same ones
    read again (a watch's index replaced them in place: a status written, an
    edit); None unless that is all that changed, each under the same name."""
    kept = memo.sections.get("models")
    if kept is None or len(kept[0][0]) != len(bodies) or kept[0][1] != watched:
        return None
    before: list[Raw] = kept[0][0]
    old_models: dict[str, ModelObject] = kept[1]
    read = memo.read.get("localmodels", {})
    if (replaced := _replaced(before, bodies, read)) is None:
        return None
    again = []
    for i, (old_version, was) in replaced:
        version, m = _model_reading(bodies[i], memo)
        shown = not watched or m.namespace in watched
        if m.key != was.key or (shown and old_models.get(m.key) is not was):
            return None  # (another name, or not the object the section holds)
        again.append((before[i], bodies[i], old_version, version, m, shown))
    models = dict(old_models)
    for was_body, body, old_version, version, m, shown in again:
        del read[id(was_body)]
        read[id(body)] = (body, (version, m))
        if old_version:
            memo.models.pop(old_version, None)
        if version:
            memo.models[version] = m
        if shown:
            models[m.key] = m
    return models


def _observe_models(bodies: Sequence[Raw], watched: frozenset[str], memo: Parsed
                    ) -> dict[str, ModelObject]:
    """The LocalModels in the watched namespaces, each stored version parsed once."""
    if (quick := _models_again(bodies, watched, memo)) is not None:
        return quick
    readings = memo.each("localmodels", bodies, partial(_model_reading, memo=memo))
    memo.models = {version: m for version, m in readings if version}
    return {m.key: m for _, m in readings if not watched or m.namespace in watched}


def _node_reading(body: Raw, memo: Parsed) -> tuple[str, Version | None, NodeFacts | str]:
    version = version_of(body)
    facts = memo.nodes.get(version) if version else None
    return (str(metadata(body).get("name") or ""), version,
            _node_facts(body) if facts is None else facts)


def _nodes_again(bodies: Sequence[Raw], memo: Parsed
                 ) -> tuple[dict[str, NodeFacts], dict[str, str]] | None:
    """The last nodes section with the few objects that are not the same ones
    read again (a watch's index replaced them in place); None unless that is
    all that changed, each under the same name, still good or still bad."""
    kept = memo.sections.get("nodes")
    if kept is None or len(kept[0][0]) != len(bodies):
        return None
    before: list[Raw] = kept[0][0]
    old_nodes, old_bad = kept[1]
    if len(old_nodes) + len(old_bad) != len(bodies):  # (no name twice)
        return None
    read = memo.read.get("nodes", {})
    if (replaced := _replaced(before, bodies, read)) is None:
        return None
    again = []
    for i, (old_name, old_version, old_facts) in replaced:
        name, version, facts = reading = _node_reading(bodies[i], memo)
        if (name, isinstance(facts, str)) != (old_name, isinstance(old_facts, str)) or any(
                not isinstance(f, str) and f.name != name for f in (facts, old_facts)):
            return None
        again.append((before[i], bodies[i], old_version, reading))
    nodes, bad = dict(old_nodes), dict(old_bad)
    for was, body, old_version, (name, version, facts) in again:
        del read[id(was)]
        read[id(body)] = (body, (name, version, facts))
        memo.nodes.pop(old_version, None)
        if version:
            memo.nodes[version] = facts
        if isinstance(facts, str):
            bad[name] = facts
        else:
            nodes[name] = facts
    memo.nodes_since = (old_nodes, nodes, frozenset(
        name for _, _, _, (name, _, facts) in again if old_nodes.get(name) is not facts))
    return nodes, bad


def _observe_nodes(bodies: Sequence[Raw], memo: Parsed
                   ) -> tuple[dict[str, NodeFacts], dict[str, str]]:
    """Every Node's facts (or why it has none), each stored version read once."""
    memo.nodes_since = None
    if (quick := _nodes_again(bodies, memo)) is not None:
        return quick
    nodes: dict[str, NodeFacts] = {}
    bad: dict[str, str] = {}
    readings = memo.each("nodes", bodies, partial(_node_reading, memo=memo))
    for name, _, facts in readings:
        if isinstance(facts, str):
            bad[name] = facts
        else:
            nodes[facts.name] = facts
    memo.nodes = {version: facts for _, version, facts in readings if version}
    return nodes, bad


def _pod_reading(body: Raw) -> tuple[OwnedPod | None, str | None, tuple[int, int]]:
    node = pod_node(body)
    return owned_pod(body), node, pod_requests(body) if node else (0, 0)


def _observe_pods(bodies: Sequence[Raw], watched: frozenset[str], valid_uids: frozenset[str],
                  memo: Parsed) -> tuple[dict[Key, OwnedPod], dict[str, Usage]]:
    """The operator's own pods, and the requests of every other pod per node."""
    pods: dict[Key, OwnedPod] = {}
    usage: dict[str, list[int]] = {}
    for pod, node, (cpu, memory) in memo.each("pods", bodies, _pod_reading):
        if pod is not None and (not watched or pod.namespace in watched):
            pods[pod.key] = pod
        # Our pods of valid models are the planner's own placements; everything
        # else that runs on a node (other pods, and ours whose model is gone or
        # invalid) is usage the planner must respect.
        if node and (pod is None or pod.owner_uid not in valid_uids):
            total = usage.setdefault(node, [0, 0])
            total[0] += cpu
            total[1] += memory
    return pods, {n: Usage(cpu_milli=c, memory_bytes=m) for n, (c, m) in sorted(usage.items())}


def _observe_claims(bodies: Sequence[Raw], watched: frozenset[str], memo: Parsed
                    ) -> dict[Key, OwnedClaim]:
    return {claim.key: claim for claim in memo.each("claims", bodies, owned_claim)
            if claim is not None and (not watched or claim.namespace in watched)}


def _observe_objects(snap: Snapshot, watched: frozenset[str], memo: Parsed
                     ) -> dict[tuple[str, str, str], OwnedObject]:
    out: dict[tuple[str, str, str], OwnedObject] = {}
    for kind, bodies in (("ConfigMap", snap.configmaps), ("Service", snap.services),
                         ("NetworkPolicy", snap.networkpolicies)):
        for obj in memo.each(kind, bodies, partial(owned_object, kind=kind)):
            if obj is not None and (not watched or obj.namespace in watched):
                out[(kind, obj.namespace, obj.name)] = obj
    return out


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


# Scheduler messages that say the pod cannot run on *any* node (its claim has
# no class and nothing binds it, ...): moving it to another node cannot help.
_NOT_THE_NODE = ("unbound immediate PersistentVolumeClaims", "persistentvolumeclaim \"")


@dataclass(frozen=True)
class StuckPod:
    model: str
    replica: int
    pod: str
    node: str  # the node the pod was placed on (its node affinity)
    since: float  # seconds since the epoch
    message: str = ""

    @property
    def node_specific(self) -> bool:
        """Whether another node could help (else: report, do not move)."""
        return not any(m in self.message for m in _NOT_THE_NODE)


def _epoch(rfc3339: str) -> float | None:
    import datetime as dt

    try:
        return dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


def unschedulable(obs: Observed) -> list[StuckPod]:
    """Our pods the scheduler has marked Unschedulable, with the node they were
    placed on and since when (once per `Observed`)."""
    if obs._stuck is not None:
        return obs._stuck
    out = []
    for pod in obs.pods.values():
        if pod.unschedulable_since is None or pod.terminating or pod.node is None:
            continue
        since = _epoch(pod.unschedulable_since)
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
