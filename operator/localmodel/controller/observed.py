"""What the watches hold, turned into what the planner and the changes need. Pure.

Input is a `Snapshot`: the raw objects (dicts, as the API server returns them)
that the watches keep in memory. Output is an `Observed`: parsed models (or the
field error that stops each one), node facts, the operator's own pods, claims,
ConfigMaps and Services, the volumes claims are bound to, and every other pod's
requests per node. One object at a time is read by `objects.py` (which also
says how the operator's own objects are recognised) and `volumes.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
from localmodel.controller.volumes import Volume, volume
from localmodel.facts import NodeFacts
from localmodel.facts.node import NodeFactsError, from_node
from localmodel.facts.pod import pod_node, pod_requests
from localmodel.gaps import StorageClasses, storage_classes
from localmodel.planner import Usage


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
    # several times, and a scan per lookup would make a pass quadratic.
    _pods_by_model: dict[str, list[OwnedPod]] | None = field(default=None, repr=False)
    _claims_by_model: dict[str, list[OwnedClaim]] | None = field(default=None, repr=False)

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


Version = tuple[str, str]  # (uid, resourceVersion): one stored version of an object


@dataclass
class Parsed:
    """LocalModels and Nodes parsed, by stored version. The reconciler keeps one
    between passes so each stored version is parsed once, and the same parsed
    object comes back (the long-lived `Desired` compares models by identity)."""

    models: dict[Version, ModelObject] = field(default_factory=dict)
    nodes: dict[Version, NodeFacts | str] = field(default_factory=dict)  # str: why it is bad


def _version(body: Raw) -> Version | None:
    meta = metadata(body)
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    return (str(uid), str(rv)) if uid and rv else None


def _node_facts(body: Raw) -> NodeFacts | str:
    try:
        return from_node(body)
    except (NodeFactsError, ValueError, TypeError) as exc:
        return str(exc)


def observe(snap: Snapshot, namespaces: Iterable[str] = (), parsed: Parsed | None = None
            ) -> Observed:
    """Parse a snapshot. Never raises because of one bad object. `parsed`: what
    earlier passes parsed (updated here to this snapshot's versions)."""
    watched = set(namespaces)
    obs = Observed()
    before = parsed or Parsed()
    now = Parsed()
    _observe_models(obs, snap.localmodels, watched, before, now)
    _observe_nodes(obs, snap.nodes, before, now)
    if parsed is not None:
        parsed.models, parsed.nodes = now.models, now.nodes
    _observe_pods(obs, snap.pods, watched)
    for body in snap.claims:
        claim = owned_claim(body)
        if claim is not None and (not watched or claim.namespace in watched):
            obs.claims[claim.key] = claim
    for kind, bodies in (("ConfigMap", snap.configmaps), ("Service", snap.services),
                         ("NetworkPolicy", snap.networkpolicies)):
        for body in bodies:
            obj = owned_object(body, kind)
            if obj is not None and (not watched or obj.namespace in watched):
                obs.objects[(kind, obj.namespace, obj.name)] = obj
    for body in snap.volumes:
        v = volume(body)
        obs.volumes[v.name] = v
    obs.storage_classes = storage_classes(snap.storageclasses)
    return obs


def _observe_models(obs: Observed, bodies: Sequence[Raw], watched: set[str], before: Parsed,
                    now: Parsed) -> None:
    """The LocalModels in the watched namespaces, each stored version parsed once."""
    for body in bodies:
        version = _version(body)
        m = before.models.get(version) if version else None
        if m is None:
            m = parse_model(body)
        if version:
            now.models[version] = m
        if watched and m.namespace not in watched:
            continue
        obs.models[m.key] = m


def _observe_nodes(obs: Observed, bodies: Sequence[Raw], before: Parsed, now: Parsed) -> None:
    """Every Node's facts (or why it has none), each stored version read once."""
    for body in bodies:
        name = str(metadata(body).get("name") or "")
        version = _version(body)
        facts = before.nodes.get(version) if version else None
        if facts is None:
            facts = _node_facts(body)
        if version:
            now.nodes[version] = facts
        if isinstance(facts, str):
            obs.bad_nodes[name] = facts
            continue
        obs.nodes[facts.name] = facts


def _observe_pods(obs: Observed, bodies: Sequence[Raw], watched: set[str]) -> None:
    """The operator's own pods, and the requests of every other pod per node."""
    valid_uids = {m.uid for m in obs.models.values() if m.model is not None}
    usage: dict[str, list[int]] = {}
    for body in bodies:
        pod = owned_pod(body)
        if pod is not None and (not watched or pod.namespace in watched):
            obs.pods[pod.key] = pod
        node = pod_node(body)
        # Our pods of valid models are the planner's own placements; everything
        # else that runs on a node (other pods, and ours whose model is gone or
        # invalid) is usage the planner must respect.
        if node and (pod is None or pod.owner_uid not in valid_uids):
            cpu, memory = pod_requests(body)
            total = usage.setdefault(node, [0, 0])
            total[0] += cpu
            total[1] += memory
    obs.usage = {n: Usage(cpu_milli=c, memory_bytes=m) for n, (c, m) in sorted(usage.items())}


def current_placements(obs: Observed) -> dict[str, list[str | None]]:
    """Where each replica of each valid model is now: its pod's node, else the
    node its status last recorded (a pod deleted for a roll or lost in a crash)."""
    out: dict[str, list[str | None]] = {}
    for key, m in obs.models.items():
        if m.model is None:
            continue
        nodes: list[str | None] = [None] * m.model.spec.replicas
        if m.status is not None:
            for p in m.status.placements:
                if 0 <= p.replica < len(nodes):
                    nodes[p.replica] = p.node
        for pod in obs.pods_of(key):
            if pod.owner_uid == m.uid and 0 <= pod.replica < len(nodes) and pod.node:
                nodes[pod.replica] = pod.node
        out[key] = nodes
    return out


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
    placed on and since when."""
    out = []
    for pod in obs.pods.values():
        if pod.unschedulable_since is None or pod.terminating or pod.node is None:
            continue
        since = _epoch(pod.unschedulable_since)
        if since is not None:
            out.append(StuckPod(pod.model, pod.replica, pod.name, pod.node, since,
                                pod.unschedulable_message))
    return sorted(out, key=lambda s: (s.model, s.replica))


def readiness(obs: Observed) -> dict[str, dict[int, bool]]:
    out: dict[str, dict[int, bool]] = {}
    for key, m in obs.models.items():
        if m.model is None:
            continue
        # A pod on a node that is gone is not serving, whatever it last reported.
        out[key] = {p.replica: p.ready and p.node in obs.nodes
                    for p in obs.pods_of(key) if p.owner_uid == m.uid}
    return out
