"""What must change: desired objects vs what exists -> Create | Apply | Delete. Pure.

Rules (each is a row in tests/unit/test_changes.py):
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
* Only objects with the operator's labels and the model's uid as controller
  owner are ever deleted or applied.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localmodel.api import LocalModel
from localmodel.contract import ANNOTATION_APPLIED_HASH, ANNOTATION_POD_SPEC_HASH, LABEL_REPLICA
from localmodel.controller.observed import (
    Observed,
    OwnedClaim,
    OwnedPod,
    volume_reaches,
)
from localmodel.desired import ModelResult
from localmodel.render import claim_name
from localmodel.status import EventReason, EventSpec

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Create:
    manifest: Manifest
    why: str = ""
    event: EventSpec | None = None


@dataclass(frozen=True)
class Apply:
    manifest: Manifest
    why: str = ""


@dataclass(frozen=True)
class Delete:
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


Change = Create | Apply | Delete


@dataclass(frozen=True)
class ModelChanges:
    changes: tuple[Change, ...] = ()
    # Set while a roll (or start-up) is under way: the Progressing message.
    rolling: str | None = None


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


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


def _by_kind(objects: Sequence[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o.get("kind") == kind]


def _claim_owned(manifest: Manifest) -> bool:
    return bool(manifest["metadata"].get("ownerReferences"))


def _claim_ownership(manifest: Manifest) -> Manifest:
    """Only the metadata of a claim: its spec is never rewritten."""
    meta = manifest["metadata"]
    out_meta = {k: meta[k] for k in ("name", "namespace", "labels", "ownerReferences") if k in meta}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": out_meta}


def model_changes(result: ModelResult, uid: str, obs: Observed) -> ModelChanges:
    """Everything that must change for one valid model (see the module rules)."""
    lm = result.model
    key = lm.key
    ns = lm.metadata.namespace
    out: list[Change] = []

    # ConfigMap and Service: create, or apply when the hash differs.
    for kind in ("ConfigMap", "Service"):
        for manifest in _by_kind(result.objects, kind):
            desired = with_applied_hash(manifest)
            name = manifest["metadata"]["name"]
            have = obs.objects.get((kind, ns, name))
            if have is None:
                out.append(Create(desired, f"{kind} {name} is missing"))
            elif have.owner_uid == uid and have.applied_hash != desired["metadata"][
                "annotations"][ANNOTATION_APPLIED_HASH]:
                out.append(Apply(desired, f"{kind} {name} differs from the spec"))

    # Claims: create when missing; re-apply ownership only.
    wanted_claims: set[str] = set()
    for manifest in _by_kind(result.objects, "PersistentVolumeClaim"):
        name = manifest["metadata"]["name"]
        wanted_claims.add(name)
        have_claim = obs.claims.get((ns, name))
        if have_claim is None:
            replica = int(manifest["metadata"]["labels"][LABEL_REPLICA])
            # A claim under another name than the replica's own exists because
            # the old one cannot follow the replica to its new node: say so.
            event = None if name == claim_name(lm, replica) else EventSpec(
                EventReason.CREATED_CLAIM,
                f"replica {replica}: new weights claim {name} on {placed(result, replica)}: "
                "the previous claim is bound to a volume that node cannot reach")
            out.append(Create(manifest, f"claim {name} is missing", event))
        elif not have_claim.terminating and (have_claim.owner_uid is not None) != _claim_owned(
            manifest
        ):
            out.append(Apply(_claim_ownership(manifest), f"claim {name} ownership follows "
                             "storage.retain"))

    # Pods.
    pods = {p.replica: p for p in obs.pods_of(key) if p.owner_uid == uid}
    desired_pods = {int(m["metadata"]["labels"][LABEL_REPLICA]): m
                    for m in _by_kind(result.objects, "Pod")}
    placed_nodes = {r.replica: r.node for r in result.replicas}
    pending: list[str] = []  # replicas not yet running the current spec, for Progressing
    candidates: list[tuple[bool, int, OwnedPod, str]] = []
    in_flight = False
    for replica, manifest in sorted(desired_pods.items()):
        want_hash = manifest["metadata"]["annotations"][ANNOTATION_POD_SPEC_HASH]
        pod = pods.get(replica)
        if pod is None:
            out.append(Create(manifest, f"replica {replica} has no pod"))
            # The same words until Ready: a pod being created and one starting are
            # one state to a reader, and one status write fewer per replica.
            pending.append(f"replica {replica}: starting on {placed_nodes[replica]}")
            in_flight = True
        elif pod.terminating:
            if pod.node and pod.node not in obs.nodes:
                out.append(_delete_pod(pod, f"node {pod.node} is gone", None, force=True))
            pending.append(f"replica {replica}: waiting for the old pod to go")
            in_flight = True
        elif pod.spec_hash != want_hash:
            if pod.node and pod.node not in obs.nodes:
                out.append(_delete_pod(pod, f"node {pod.node} is gone", EventSpec(
                    EventReason.REPLACING,
                    f"replica {replica}: pod {pod.name} deleted: node {pod.node} is gone; "
                    f"re-created on {placed_nodes[replica]}"), force=True))
                pending.append(f"replica {replica}: moving to {placed_nodes[replica]}")
                in_flight = True
            else:
                moved = pod.node != placed_nodes[replica]
                why = (f"moves from {pod.node} to {placed_nodes[replica]}" if moved
                       else "its spec changed")
                candidates.append((pod.ready, replica, pod, why))
                pending.append(f"replica {replica}: to be replaced ({why})")
        elif not pod.ready:
            pending.append(f"replica {replica}: starting on {pod.node}")
            in_flight = True
    if candidates and not in_flight:
        # Broken (not Ready) stale pods first: replacing them costs nothing.
        _, replica, pod, why = sorted(candidates, key=lambda c: (c[0], c[1]))[0]
        out.append(_delete_pod(pod, why, EventSpec(
            EventReason.REPLACING, f"replica {replica}: pod {pod.name} replaced: {why}")))

    # Pods no replica wants any more: scaled down, or a replica with no node
    # whose old node is gone. An unplaced replica's pod on a live node stays.
    for replica, pod in sorted(pods.items()):
        if replica in desired_pods or pod.terminating:
            continue
        if replica >= lm.spec.replicas:
            out.append(_delete_pod(pod, "scaled down", EventSpec(
                EventReason.SCALED_DOWN,
                f"replica {replica}: pod {pod.name} deleted: spec.replicas is "
                f"{lm.spec.replicas}")))
        elif pod.node and pod.node not in obs.nodes:
            out.append(_delete_pod(pod, f"node {pod.node} is gone", EventSpec(
                EventReason.REPLACING,
                f"replica {replica}: pod {pod.name} deleted: node {pod.node} is gone"),
                force=True))

    # Owned claims nobody wants and no pod uses: gone. Retained ones stay.
    used = {p.claim for p in obs.pods_of(key) if p.claim}
    for claim in obs.claims_of(key):
        if (
            claim.owner_uid == uid
            and not claim.terminating
            and claim.name not in wanted_claims
            and claim.name not in used
            and not _may_come_back(claim, lm, wanted_claims)
        ):
            out.append(Delete("PersistentVolumeClaim", claim.namespace, claim.name, claim.uid,
                              "no replica uses it (storage.retain is false)"))

    rolling = "; ".join(pending) if pending else None
    return ModelChanges(tuple(out), rolling)


def _may_come_back(claim: OwnedClaim, lm: LocalModel, wanted: set[str]) -> bool:
    """A replica that is only unplaced right now keeps its claim."""
    return claim.replica < lm.spec.replicas and not any(
        w == claim_name(lm, claim.replica) or w.startswith(claim_name(lm, claim.replica) + "-")
        for w in wanted
    )


def _delete_pod(pod: OwnedPod, why: str, event: EventSpec | None,
                force: bool = False) -> Delete:
    return Delete("Pod", pod.namespace, pod.name, pod.uid, why, event, force)


def placed(result: ModelResult, replica: int) -> str:
    return next((r.node for r in result.replicas if r.replica == replica), "?")
