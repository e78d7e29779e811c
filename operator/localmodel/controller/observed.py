"""What the watches hold, turned into what the planner and the changes need. Pure.

Input is a `Snapshot`: the raw objects (dicts, as the API server returns them)
that the watches keep in memory. Output is an `Observed`: parsed models (or the
field error that stops each one), node facts, the operator's own pods, claims,
ConfigMaps and Services, the volumes claims are bound to, and every other pod's
requests per node. The operator's objects are recognised by its labels *and*
(for everything the LocalModel owns) an owner reference to the LocalModel, so
nothing the operator did not create is ever taken for its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel, LocalModelStatus, parse_local_model
from localmodel.contract import (
    ANNOTATION_APPLIED_HASH,
    ANNOTATION_NODE,
    ANNOTATION_POD_SPEC_HASH,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    MANAGED_BY,
    VOLUME_WEIGHTS,
)
from localmodel.errors import InvalidObject, format_errors
from localmodel.facts import NodeFacts
from localmodel.facts.node import NodeFactsError, from_node
from localmodel.facts.pod import pod_node, pod_requests
from localmodel.planner import Usage

Raw = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, name)


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


@dataclass(frozen=True)
class ModelObject:
    """One LocalModel as stored: parsed, or the reason it cannot be."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    model: LocalModel | None
    error: str  # empty when `model` parsed
    status: LocalModelStatus | None  # what is stored (None if absent or unreadable)
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class OwnedPod:
    namespace: str
    name: str
    uid: str
    model: str  # "namespace/name" of the LocalModel
    owner_uid: str
    replica: int
    node: str | None
    spec_hash: str
    ready: bool
    terminating: bool
    claim: str | None
    # lastTransitionTime of PodScheduled=False/Unschedulable, if the pod is stuck
    unschedulable_since: str | None = None
    unschedulable_message: str = ""
    ip: str | None = None  # status.podIP: where its gateway answers

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OwnedClaim:
    namespace: str
    name: str
    uid: str
    model: str
    replica: int
    owner_uid: str | None  # None: retained (not owned, survives the model)
    volume: str | None
    terminating: bool

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OwnedObject:
    """A ConfigMap or Service the operator applied."""

    kind: str
    namespace: str
    name: str
    uid: str
    model: str
    owner_uid: str
    applied_hash: str


@dataclass(frozen=True)
class Volume:
    """A PersistentVolume and the nodes it can be used from (None: any node)."""

    name: str
    terms: tuple[Raw, ...] | None


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


def _section(obj: Raw, name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Raw) -> Mapping[str, Any]:
    return _section(obj, "metadata")


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("apiVersion") == API_VERSION
            and ref.get("kind") == KIND
            and ref.get("controller")
        ):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def _ours(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, model name) when the object carries the operator's labels."""
    labels = _str_map(meta.get("labels"))
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or not labels.get(LABEL_NAME):
        return None
    return str(meta.get("namespace") or ""), labels[LABEL_NAME]


def _replica(meta: Mapping[str, Any]) -> int | None:
    raw = _str_map(meta.get("labels")).get(LABEL_REPLICA, "")
    return int(raw) if raw.isdigit() else None


def parse_model(body: Raw) -> ModelObject:
    """A stored LocalModel: the spec strictly, the status tolerantly (fields
    others wrote are ignored; a status that cannot be read counts as none)."""
    meta = _meta(body)
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    generation = meta.get("generation") if isinstance(meta.get("generation"), int) else None
    rv = str(meta.get("resourceVersion") or "")
    status: LocalModelStatus | None = None
    raw_status = body.get("status")
    if isinstance(raw_status, Mapping) and raw_status:
        try:
            status = LocalModelStatus.model_validate(raw_status)
        except ValidationError:
            status = None
    without_status = {k: v for k, v in body.items() if k != "status"}
    try:
        model = parse_local_model(without_status)
    except InvalidObject as exc:
        return ModelObject(namespace, name, uid, generation, None, format_errors(exc.errors),
                           status, rv)
    if status is not None:
        model = model.model_copy(update={"status": status})
    return ModelObject(namespace, name, uid, generation, model, "", status, rv)


def _pod_ready(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _unschedulable(status: Mapping[str, Any]) -> tuple[str | None, str]:
    """(since, message) of a PodScheduled=False/Unschedulable condition."""
    for c in status.get("conditions") or []:
        if (
            isinstance(c, Mapping)
            and c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return str(c.get("lastTransitionTime") or "") or None, str(c.get("message") or "")
    return None, ""


def _pod_claim(spec: Mapping[str, Any]) -> str | None:
    for v in spec.get("volumes") or []:
        if isinstance(v, Mapping) and v.get("name") == VOLUME_WEIGHTS:
            pvc = v.get("persistentVolumeClaim")
            if isinstance(pvc, Mapping) and pvc.get("claimName"):
                return str(pvc["claimName"])
    return None


def owned_pod(body: Raw) -> OwnedPod | None:
    meta = _meta(body)
    who = _ours(meta)
    replica = _replica(meta)
    owner = _controller_uid(meta)
    if who is None or replica is None or owner is None:
        return None
    spec, status = _section(body, "spec"), _section(body, "status")
    annotations = _str_map(meta.get("annotations"))
    since, why = _unschedulable(status)
    return OwnedPod(
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        owner_uid=owner,
        replica=replica,
        node=pod_node(body) or annotations.get(ANNOTATION_NODE),
        spec_hash=annotations.get(ANNOTATION_POD_SPEC_HASH, ""),
        ready=_pod_ready(status) and not meta.get("deletionTimestamp"),
        terminating=bool(meta.get("deletionTimestamp")),
        claim=_pod_claim(spec),
        unschedulable_since=since,
        unschedulable_message=why,
        ip=str(status["podIP"]) if status.get("podIP") else None,
    )


def owned_claim(body: Raw) -> OwnedClaim | None:
    meta = _meta(body)
    who = _ours(meta)
    replica = _replica(meta)
    if who is None or replica is None:
        return None
    spec = _section(body, "spec")
    return OwnedClaim(
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        replica=replica,
        owner_uid=_controller_uid(meta),
        volume=str(spec.get("volumeName")) if spec.get("volumeName") else None,
        terminating=bool(meta.get("deletionTimestamp")),
    )


def owned_object(body: Raw, kind: str) -> OwnedObject | None:
    meta = _meta(body)
    who = _ours(meta)
    owner = _controller_uid(meta)
    if who is None or owner is None:
        return None
    return OwnedObject(
        kind=kind,
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        owner_uid=owner,
        applied_hash=_str_map(meta.get("annotations")).get(ANNOTATION_APPLIED_HASH, ""),
    )


def volume(body: Raw) -> Volume:
    spec = _section(body, "spec")
    affinity = spec.get("nodeAffinity")
    required = affinity.get("required") if isinstance(affinity, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    name = str(_meta(body).get("name") or "")
    if not isinstance(terms, list) or not terms:
        return Volume(name, None)
    return Volume(name, tuple(t for t in terms if isinstance(t, Mapping)))


def _expression_matches(expr: Raw, values_of: Mapping[str, str]) -> bool:
    key, op = str(expr.get("key", "")), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in values_of
    if op == "In":
        return present and values_of[key] in values
    if op == "NotIn":
        return not present or values_of[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(values_of[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def volume_reaches(vol: Volume, node: NodeFacts) -> bool:
    """Whether a pod on `node` can use the volume (its node affinity, as the
    scheduler evaluates it: terms ORed, expressions within a term ANDed)."""
    if vol.terms is None:
        return True
    fields = {"metadata.name": node.name}
    for term in vol.terms:
        exprs = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
        field_exprs = [e for e in term.get("matchFields") or [] if isinstance(e, Mapping)]
        if not exprs and not field_exprs:
            continue  # an empty term matches nothing
        if all(_expression_matches(e, node.labels) for e in exprs) and all(
            _expression_matches(e, fields) for e in field_exprs
        ):
            return True
    return False


Version = tuple[str, str]  # (uid, resourceVersion): one stored version of an object


@dataclass
class Parsed:
    """LocalModels and Nodes parsed, by stored version. The reconciler keeps one
    between passes so each stored version is parsed once, and the same parsed
    object comes back (the long-lived `Desired` compares models by identity)."""

    models: dict[Version, ModelObject] = field(default_factory=dict)
    nodes: dict[Version, NodeFacts | str] = field(default_factory=dict)  # str: why it is bad


def _version(body: Raw) -> Version | None:
    meta = _meta(body)
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
    for body in snap.localmodels:
        version = _version(body)
        m = before.models.get(version) if version else None
        if m is None:
            m = parse_model(body)
        if version:
            now.models[version] = m
        if watched and m.namespace not in watched:
            continue
        obs.models[m.key] = m
    for body in snap.nodes:
        name = str(_meta(body).get("name") or "")
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
    if parsed is not None:
        parsed.models, parsed.nodes = now.models, now.nodes
    valid_uids = {m.uid for m in obs.models.values() if m.model is not None}
    usage: dict[str, list[int]] = {}
    for body in snap.pods:
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
    for body in snap.claims:
        claim = owned_claim(body)
        if claim is not None and (not watched or claim.namespace in watched):
            obs.claims[claim.key] = claim
    for kind, bodies in (("ConfigMap", snap.configmaps), ("Service", snap.services)):
        for body in bodies:
            obj = owned_object(body, kind)
            if obj is not None and (not watched or obj.namespace in watched):
                obs.objects[(kind, obj.namespace, obj.name)] = obj
    for body in snap.volumes:
        v = volume(body)
        obs.volumes[v.name] = v
    return obs


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
