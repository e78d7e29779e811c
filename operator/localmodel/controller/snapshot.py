"""The watches' objects (`Snapshot`) read into what a pass sees (`observe`:
an `Observed`), never failing on one bad object. Pure.

`observe` with a fresh `parse_memo.Parsed` is the plain path; the reconciler
passes its long-lived one, so a pass reads only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from localmodel.controller.objects import (
    Key,
    ModelObject,
    OwnedClaim,
    OwnedDoorman,
    OwnedObject,
    OwnedPod,
    Raw,
    owned_claim,
    owned_doorman,
    owned_object,
    owned_pod,
)
from localmodel.controller.observed import Observed, changed_keys, take_views
from localmodel.controller.parse_memo import (
    Parsed,
    model_reading,
    models_again,
    node_reading,
    nodes_again,
)
from localmodel.controller.volumes import volume
from localmodel.facts import NodeFacts
from localmodel.facts.pod import pod_node, pod_requests
from localmodel.gaps import storage_classes
from localmodel.planner import Usage

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
    pods, usage, doormen = take("pods", (snap.pods,), (watched, valid),
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
    obs = Observed(models, nodes, bad, pods, claims, objects, volumes, usage, classes, doormen)
    if last is not None and memo.nodes_since is not None and memo.nodes_since[1] is nodes:
        obs.nodes_since = (last.nodes, memo.nodes_since[2]) if memo.nodes_since[0] is (
            last.nodes) else None
    if since is not None and memo.valid is not None and memo.valid[2]:
        # The same valid models (a few new objects): the per-model views of
        # the others are the last ones. (`since` is not kept with `obs`: it
        # would hold the last models, and freeing them all falls to a later pass.)
        same.add("valid models")
    if last is not None:
        take_views(obs, last, same, since)
    memo.last = obs
    return obs


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


def _observe_models(bodies: Sequence[Raw], watched: frozenset[str], memo: Parsed
                    ) -> dict[str, ModelObject]:
    """The LocalModels in the watched namespaces, each stored version parsed once."""
    if (quick := models_again(bodies, watched, memo)) is not None:
        return quick
    readings = memo.each("localmodels", bodies, partial(model_reading, memo=memo))
    memo.models = {version: m for version, m in readings if version}
    return {m.key: m for _, m in readings if not watched or m.namespace in watched}


def _observe_nodes(bodies: Sequence[Raw], memo: Parsed
                   ) -> tuple[dict[str, NodeFacts], dict[str, str]]:
    """Every Node's facts (or why it has none), each stored version read once."""
    memo.nodes_since = None
    if (quick := nodes_again(bodies, memo)) is not None:
        return quick
    nodes: dict[str, NodeFacts] = {}
    bad: dict[str, str] = {}
    readings = memo.each("nodes", bodies, partial(node_reading, memo=memo))
    for name, _, facts in readings:
        if isinstance(facts, str):
            bad[name] = facts
        else:
            nodes[facts.name] = facts
    memo.nodes = {version: facts for _, version, facts in readings if version}
    return nodes, bad


PodReading = tuple[OwnedPod | None, OwnedDoorman | None, str | None, tuple[int, int]]


def _pod_reading(body: Raw) -> PodReading:
    node = pod_node(body)
    pod = owned_pod(body)
    doorman = owned_doorman(body) if pod is None else None
    return pod, doorman, node, pod_requests(body) if node else (0, 0)


def _observe_pods(bodies: Sequence[Raw], watched: frozenset[str], valid_uids: frozenset[str],
                  memo: Parsed
                  ) -> tuple[dict[Key, OwnedPod], dict[str, Usage], dict[Key, OwnedDoorman]]:
    """The operator's own pods (its replicas' and its doormen), and the
    requests of every other pod per node."""
    pods: dict[Key, OwnedPod] = {}
    doormen: dict[Key, OwnedDoorman] = {}
    usage: dict[str, list[int]] = {}
    for pod, doorman, node, (cpu, memory) in memo.each("pods", bodies, _pod_reading):
        if pod is not None and (not watched or pod.namespace in watched):
            pods[pod.key] = pod
        if doorman is not None and (not watched or doorman.namespace in watched):
            doormen[doorman.key] = doorman
        # Our pods of valid models are the planner's own placements; everything
        # else that runs on a node (other pods, and ours whose model is gone or
        # invalid) is usage the planner must respect.
        if node and (pod is None or pod.owner_uid not in valid_uids):
            total = usage.setdefault(node, [0, 0])
            total[0] += cpu
            total[1] += memory
    return (pods, {n: Usage(cpu_milli=c, memory_bytes=m) for n, (c, m) in sorted(usage.items())},
            doormen)


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

