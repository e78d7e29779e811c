"""What must change: desired objects vs what exists -> Create | Apply | Delete. Pure.

Rules (each is a row in tests/controller/test_changes.py):
* ConfigMaps and Services: created when missing; server-side applied when the
  hash of the desired object differs from the one recorded on it
  (`localmodel.dev/applied-hash`), so identical objects are never re-applied.
* Claims: one per replica, created when missing and never shrunk or rewritten;
  only their ownership is re-applied when `storage.retain` flips. The claim a
  replica mounts is chosen by `choose_claim`: the one its pod uses, else its
  own name, else any of its claims whose volume reaches the node, else a new
  name. A claim bound to a volume the node cannot reach is left for the old
  node: kept when retained, deleted (once no pod uses it) when owned.
* Pods: created when missing; replaced (deleted, then created by a later pass
  once gone) when the rendered pod-spec hash differs, one replica at a time:
  no replacement starts while another replica's pod is missing, terminating or
  not yet Ready with the current spec. A pod whose node is gone is deleted at
  once (the replica is re-placed elsewhere). A replica never has two pods:
  pod names are per replica, and a new pod is only created once the old one
  is gone.
* Scale down: pods of replicas beyond `spec.replicas` are deleted; their owned
  claims go once no pod uses them. Retained claims are never deleted.
* Released (`spec.idle`: asleep, every replica's gateway closed): its pods are
  deleted the same way, and its claims all stay (each replica may come back);
  none is created until it wakes.
* The doorman (`spec.idle`, render/doorman.py): a model released or waking
  with no Ready replica gets its doorman pod (created when missing, the
  model's last wake as its Retry-After, the router's address from the
  options); it is deleted once a replica is Ready, and whenever the model may
  not have one (asleep but resident, awake, `replicas: 0`, no `spec.idle` or
  gateway). A model whose idle state is unknown this pass keeps what it has.
  Deleted with the model (its owner reference).
* Only objects with the operator's labels and the model's uid as controller
  owner are ever deleted or applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from localmodel.api import IdleStatus, LocalModel
from localmodel.contract import ANNOTATION_APPLIED_HASH
from localmodel.controller.objects import OwnedClaim, OwnedPod
from localmodel.controller.observed import Observed
from localmodel.controller.volumes import volume_reaches
from localmodel.desired import ModelResult
from localmodel.events import EventReason, EventSpec
from localmodel.render import RenderOptions, manifest_hash, replica_claim
from localmodel.render.doorman import doorman_name, doorman_objects, wants_doorman
from localmodel.render.names import claim_name, claim_owned, pod_name

Manifest = dict[str, Any]


class Target(NamedTuple):
    """The object a change writes."""

    kind: str
    namespace: str
    name: str


def _target(manifest: Manifest) -> Target:
    meta = manifest["metadata"]
    return Target(str(manifest["kind"]), str(meta["namespace"]), str(meta["name"]))


def mounted(pod: Manifest) -> set[Target]:
    """The claims and ConfigMaps a pod manifest mounts: the scheduler leaves it
    Pending until they exist."""
    namespace = str(pod["metadata"]["namespace"])
    out: set[Target] = set()
    for volume in pod["spec"].get("volumes", ()):
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            out.add(Target("PersistentVolumeClaim", namespace, str(claim)))
        elif "configMap" in volume:
            out.add(Target("ConfigMap", namespace, str(volume["configMap"]["name"])))
    return out


@dataclass(frozen=True)
class Create:
    """One object to create, with why and the Event it is told by."""

    manifest: Manifest
    why: str = ""
    event: EventSpec | None = None

    @property
    def target(self) -> Target:
        return _target(self.manifest)


@dataclass(frozen=True)
class Apply:
    """A server-side apply of `manifest` (with the operator's field manager)."""

    manifest: Manifest
    why: str = ""
    event: None = None  # an apply is never worth an Event

    @property
    def target(self) -> Target:
        return _target(self.manifest)


@dataclass(frozen=True)
class Delete:
    """One object to delete: its name, the uid it must still have (never a newer one), why."""

    kind: str
    namespace: str
    name: str
    uid: str  # precondition: never delete a newer object of the same name
    why: str = ""
    event: EventSpec | None = None
    # A pod on a node that is gone has no kubelet to confirm a graceful
    # deletion: it would stay Terminating until the pod garbage collector
    # force-deletes it (tens of seconds), blocking its replica's new pod.
    force: bool = False

    @property
    def target(self) -> Target:
        return Target(self.kind, self.namespace, self.name)


Change = Create | Apply | Delete


@dataclass(frozen=True)
class ModelChanges:
    """Decides one model's writes: its changes in order, and the Progressing message while a roll
    is under way."""

    changes: tuple[Change, ...] = ()
    # Set while a roll (or start-up) is under way: the Progressing message.
    rolling: str | None = None


def with_applied_hash(manifest: Manifest) -> Manifest:
    """The manifest carrying the hash of itself (without the hash)."""
    digest = manifest_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION_APPLIED_HASH: digest}
    return {**manifest, "metadata": meta}


def choose_claim(lm: LocalModel, replica: int, node: str, obs: Observed) -> str:
    """The claim a replica mounts on `node` (pure; see the module rules). Only
    retained claims (no owner) and claims this very model owns are candidates:
    one owned by an earlier model of the same name is about to be collected."""
    key = lm.key
    claims = [c for c in obs.claims_of(key) if c.replica == replica and not c.terminating
              and c.owner_uid in (None, lm.metadata.uid)]
    target = obs.nodes.get(node)

    def reaches(c: OwnedClaim) -> bool:
        if c.volume is None:
            return True  # unbound: the scheduler binds it on the pod's node
        vol = obs.volumes.get(c.volume)
        if vol is None:
            return False  # bound to a volume that is gone: unusable anywhere
        return target is not None and volume_reaches(vol, target)

    usable = [c for c in claims if reaches(c)]
    current = {p.claim for p in obs.pods_of(key)
               if p.replica == replica and not p.terminating and p.node == node}
    for c in usable:
        if c.name in current:
            return c.name
    base = claim_name(lm, replica)
    for c in usable:
        if c.name == base:
            return base
    if usable:
        return usable[0].name
    # Claim names start with the model's name: only its own claims can collide
    # (an object of that name someone else made makes the create fail, reported).
    taken = {c.name for c in obs.claims_of(key)}
    if base not in taken:
        return base
    n = 1
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _claim_ownership(manifest: Manifest) -> Manifest:
    """Only the metadata of a claim: its spec is never rewritten."""
    meta = manifest["metadata"]
    out_meta = {k: meta[k] for k in ("name", "namespace", "labels", "ownerReferences") if k in meta}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": out_meta}


def model_changes(result: ModelResult, uid: str, obs: Observed,
                  idle: IdleStatus | None = None) -> ModelChanges:
    """Everything that must change for one valid model (see the module rules),
    one job after the other. `idle`: its idle state this pass (`status.idle`
    as the pass reports it; None: none, or unknown)."""
    claims = claim_changes(result, obs)
    pods = pod_changes(result, uid, obs)
    out = [
        *applied_changes(result, uid, obs),
        *claims.changes,
        *pods.changes,
        *unwanted_pod_changes(result, uid, obs),
        *doorman_changes(result, uid, obs, idle),
        *unused_claim_changes(result.model, uid, obs, claims.wanted),
    ]
    return ModelChanges(tuple(out), "; ".join(pods.pending) if pods.pending else None)


def applied_changes(result: ModelResult, uid: str, obs: Observed) -> list[Change]:
    """ConfigMap and Service: create when missing, apply when the hash differs
    (the manifest is made only then)."""
    ns = result.model.metadata.namespace
    out: list[Change] = []
    for (kind, name), digest in result.applied_hashes.items():
        have = obs.objects.get((kind, ns, name))
        if have is None:
            out.append(Create(with_applied_hash(result.manifest(kind, name)),
                              f"{kind} {name} is missing"))
        elif have.owner_uid == uid and have.applied_hash != digest:
            out.append(Apply(with_applied_hash(result.manifest(kind, name)),
                             f"{kind} {name} differs from the spec"))
    # A NetworkPolicy no longer wanted (turned off) goes; ConfigMaps and
    # Services stay until the model goes (garbage collection).
    for have in obs.objects_owned(ns, uid):
        kind, name = have.kind, have.name
        if kind == "NetworkPolicy" and (kind, name) not in result.applied_hashes:
            out.append(Delete(kind, ns, name, have.uid, f"{kind} {name} is no longer wanted"))
    return out


@dataclass(frozen=True)
class ClaimChanges:
    """One model's claim changes, and the claims its replicas mount."""

    changes: tuple[Change, ...]
    wanted: frozenset[str]  # the claims the replicas mount


def claim_changes(result: ModelResult, obs: Observed) -> ClaimChanges:
    """Claims: create when missing; re-apply ownership only."""
    lm = result.model
    out: list[Change] = []
    wanted: set[str] = set()
    owned = claim_owned(lm)
    for r in sorted(result.replicas, key=lambda r: r.replica):
        name = replica_claim(lm, r)
        wanted.add(name)
        have = obs.claims.get((lm.metadata.namespace, name))
        if have is None:
            # A claim under another name than the replica's own exists because
            # the old one cannot follow the replica to its new node: say so.
            event = None if name == claim_name(lm, r.replica) else EventSpec(
                EventReason.CREATED_CLAIM,
                f"replica {r.replica}: new weights claim {name} on {r.node}: "
                "the previous claim is bound to a volume that node cannot reach")
            out.append(Create(result.manifest("PersistentVolumeClaim", name),
                              f"claim {name} is missing", event))
        elif not have.terminating and (have.owner_uid is not None) != owned:
            out.append(Apply(_claim_ownership(result.manifest("PersistentVolumeClaim", name)),
                             f"claim {name} ownership follows storage.retain"))
    return ClaimChanges(tuple(out), frozenset(wanted))


@dataclass(frozen=True)
class Stale:
    """A pod whose spec is outdated: a candidate for replacement."""

    pod: OwnedPod
    why: str

    @property
    def order(self) -> tuple[bool, int]:
        # Broken (not Ready) stale pods first: replacing them costs nothing.
        return (self.pod.ready, self.pod.replica)


@dataclass(frozen=True)
class ReplicaStep:
    """What one desired replica's pod needs now."""

    changes: tuple[Change, ...] = ()
    pending: str | None = None  # why it is not yet running the current spec
    in_flight: bool = False  # a pod of it is being created, started or removed
    stale: Stale | None = None


def replica_step(replica: int, result: ModelResult, pod: OwnedPod | None, node: str,
                 obs: Observed) -> ReplicaStep:
    """One replica of `result`: `pod` is its pod (if any), `node` where it is placed."""
    if pod is None:
        # The same words until Ready: a pod being created and one starting are
        # one state to a reader, and one status write fewer per replica.
        manifest = result.manifest("Pod", pod_name(result.model, replica))
        return ReplicaStep((Create(manifest, f"replica {replica} has no pod"),),
                           f"replica {replica}: starting on {node}", in_flight=True)
    node_gone = bool(pod.node) and pod.node not in obs.nodes
    if pod.terminating:
        deletes = (_delete_pod(pod, f"node {pod.node} is gone", None, force=True),)
        return ReplicaStep(deletes if node_gone else (),
                           f"replica {replica}: waiting for the old pod to go", in_flight=True)
    if pod.spec_hash != result.pod_hashes[replica]:
        if node_gone:
            delete = _delete_pod(pod, f"node {pod.node} is gone", EventSpec(
                EventReason.REPLACING,
                f"replica {replica}: pod {pod.name} deleted: node {pod.node} is gone; "
                f"re-created on {node}"), force=True)
            return ReplicaStep((delete,), f"replica {replica}: moving to {node}",
                               in_flight=True)
        why = f"moves from {pod.node} to {node}" if pod.node != node else "its spec changed"
        return ReplicaStep(pending=f"replica {replica}: to be replaced ({why})",
                           stale=Stale(pod, why))
    if not pod.ready:
        return ReplicaStep(pending=f"replica {replica}: starting on {pod.node}", in_flight=True)
    return ReplicaStep()


@dataclass(frozen=True)
class PodChanges:
    """One model's pod changes, and the replicas not yet running the current spec."""

    changes: tuple[Change, ...]
    pending: tuple[str, ...]  # replicas not yet running the current spec, for Progressing


def pod_changes(result: ModelResult, uid: str, obs: Observed) -> PodChanges:
    """Pods of the desired replicas: create the missing, replace a stale one
    (one at a time: only when no other replica is on its way)."""
    pods = _pods(result, uid, obs)
    nodes = {r.replica: r.node for r in result.replicas}
    steps = [replica_step(replica, result, pods.get(replica), nodes[replica], obs)
             for replica in sorted(result.pod_hashes)]
    out = [c for step in steps for c in step.changes]
    stale = [step.stale for step in steps if step.stale is not None]
    if stale and not any(step.in_flight for step in steps):
        first = min(stale, key=lambda s: s.order)
        out.append(_delete_pod(first.pod, first.why, EventSpec(
            EventReason.REPLACING,
            f"replica {first.pod.replica}: pod {first.pod.name} replaced: {first.why}")))
    return PodChanges(tuple(out), tuple(s.pending for s in steps if s.pending))


def unwanted_pod_changes(result: ModelResult, uid: str, obs: Observed) -> list[Change]:
    """Pods no replica wants any more: scaled down, released (asleep, its
    gateway closed), or a replica with no node whose old node is gone. An
    unplaced replica's pod on a live node stays."""
    lm = result.model
    desired = result.pod_hashes
    out: list[Change] = []
    for replica, pod in sorted(_pods(result, uid, obs).items()):
        if replica in desired or pod.terminating:
            continue
        if replica >= lm.spec.replicas:
            out.append(_delete_pod(pod, "scaled down", EventSpec(
                EventReason.SCALED_DOWN,
                f"replica {replica}: pod {pod.name} deleted: spec.replicas is "
                f"{lm.spec.replicas}")))
        elif result.released:
            out.append(_delete_pod(pod, "asleep: released (its gateway closed)", None))
        elif pod.node and pod.node not in obs.nodes:
            out.append(_delete_pod(pod, f"node {pod.node} is gone", EventSpec(
                EventReason.REPLACING,
                f"replica {replica}: pod {pod.name} deleted: node {pod.node} is gone"),
                force=True))
    return out


def wants_doorman_now(lm: LocalModel, idle: IdleStatus | None, serving: bool) -> bool | None:
    """Whether the model's doorman should run this pass: released or waking
    with no Ready replica (True); a model that may have none, or asleep but
    resident, awake, or serving (False); None: its idle state is unknown this
    pass (what runs is left as it is)."""
    if not wants_doorman(lm):
        return False
    if idle is None:
        return None
    released = idle.state == "Asleep" and not idle.resident
    return (released or idle.state == "Waking") and not serving


def doorman_changes(result: ModelResult, uid: str, obs: Observed,
                    idle: IdleStatus | None) -> list[Change]:
    """The model's doorman: created when wanted and missing (not while a pod
    of that name, an earlier one, is still there), deleted when not wanted."""
    lm = result.model
    doormen = obs.doormen_of(lm.key)
    serving = any(p.ready and not p.terminating and p.node in obs.nodes
                  for p in obs.pods_of(lm.key) if p.owner_uid == uid)
    wanted = wants_doorman_now(lm, idle, serving)
    if wanted is None:
        return []
    if not wanted:
        why = "a replica is Ready" if serving else "the model is not released nor waking"
        return [Delete("Pod", d.namespace, d.name, d.uid, f"doorman: {why}")
                for d in doormen if d.owner_uid == uid and not d.terminating]
    if any(d.name == doorman_name(lm) for d in doormen):
        return []
    last = idle.last_wake if idle is not None else None
    options = result.options if result.options is not None else RenderOptions()
    return [Create(pod, "released: a doorman answers its Service until a replica is Ready")
            for pod in doorman_objects(lm, options, router_url=options.router_url,
                                       wake_seconds=last.seconds if last else None)]


def unused_claim_changes(lm: LocalModel, uid: str, obs: Observed,
                         wanted: frozenset[str]) -> list[Change]:
    """Owned claims nobody wants and no pod uses: gone. Retained ones stay."""
    used = {p.claim for p in obs.pods_of(lm.key) if p.claim}
    return [
        Delete("PersistentVolumeClaim", claim.namespace, claim.name, claim.uid,
               "no replica uses it (storage.retain is false)")
        for claim in obs.claims_of(lm.key)
        if claim.owner_uid == uid
        and not claim.terminating
        and claim.name not in wanted
        and claim.name not in used
        and not _may_come_back(claim, lm, wanted)
    ]


def _pods(result: ModelResult, uid: str, obs: Observed) -> dict[int, OwnedPod]:
    """The model's own pods by replica (this very model's: `uid`)."""
    return {p.replica: p for p in obs.pods_of(result.model.key) if p.owner_uid == uid}


def _may_come_back(claim: OwnedClaim, lm: LocalModel, wanted: frozenset[str]) -> bool:
    """A replica that is only unplaced right now keeps its claim; a model with
    `spec.idle` keeps each replica's own claim, its home (controller/idle_pass.py
    `homes`), while it runs elsewhere: it wakes there next (docs/idle.md, rule 3)."""
    if claim.replica >= lm.spec.replicas:
        return False
    own = claim_name(lm, claim.replica)
    if lm.spec.idle is not None and claim.name == own:
        return True
    return not any(w == own or w.startswith(own + "-") for w in wanted)


def _delete_pod(pod: OwnedPod, why: str, event: EventSpec | None,
                force: bool = False) -> Delete:
    return Delete("Pod", pod.namespace, pod.name, pod.uid, why, event, force)
