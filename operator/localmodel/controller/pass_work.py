"""The parts of a pass's work that hold no memory of their own. Pure.

One model's share of a pass (`ModelWork`) and a pass's plan (`PassPlan`), the
replicas whose speed the operator reads (`speed_targets`), the node -> models
index the kept work finds a changed node's models by (`index_node`), and the
LocalModels counted by condition (`ConditionTally`). `kept_work.py` keeps the
shares between passes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localmodel.api import LocalModelStatus
from localmodel.controller.changes import ModelChanges
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed
from localmodel.controller.speed import SpeedTarget
from localmodel.desired import ModelResult
from localmodel.facts import NodeFacts
from localmodel.render.names import pod_name
from localmodel.speed import PeerKey


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ModelWork:
    """One model's share of a pass: what to write, and the status to report."""

    model: ModelObject
    changes: ModelChanges
    status: LocalModelStatus
    failure: str = ""  # computing it raised (stage and exception): nothing changes


@dataclass(frozen=True)
class PassPlan:
    work: list[ModelWork]
    placed: dict[str, dict[int, str]]  # where this pass puts every replica
    speed_targets: tuple[SpeedTarget, ...] = ()  # Ready replicas whose gateway can be read
    # What the reconciler need not look at again: this plan's number, and (the
    # number of the plan it follows, each model whose work is not that plan's
    # very object); None: any model's may differ. (Not compared: a fresh pass
    # gives the same work without them.)
    serial: int = field(default=0, compare=False)
    since: tuple[int, dict[str, ModelWork]] | None = field(default=None, compare=False)


def took_clock(w: ModelWork) -> bool:
    """Whether the status took the clock: a condition whose status is not the
    stored one (`status.took_now`, for any model, valid or not)."""
    if w.model.status is None:
        return bool(w.status.conditions)
    previous = {c.type: c.status for c in w.model.status.conditions}
    return any(previous.get(c.type) != c.status for c in w.status.conditions)


def cpu_model(node: NodeFacts | None) -> tuple[str, str, str] | None:
    """The node's CPU model (vendor, family, model id), None unless all are known."""
    if node is None or not (node.cpu_vendor and node.cpu_family and node.cpu_model_id):
        return None
    return (node.cpu_vendor, node.cpu_family, node.cpu_model_id)


def speed_targets(result: ModelResult, obs: Observed, own_image: str) -> list[SpeedTarget]:
    """The model's replicas whose gateway the operator can read: Ready pods of
    this model with a pod IP, on the node they are planned on, with their peer
    key; vouched for when the pod's gateway runs `own_image` (the operator's)."""
    lm = result.model
    mo = obs.models.get(lm.key)
    if mo is None or not lm.spec.gateway.enabled:
        return []
    pods = {p.replica: p for p in obs.pods_of(lm.key)
            if p.owner_uid == mo.uid and p.ready and p.ip and not p.terminating}
    out = []
    for r in result.replicas:
        pod = pods.get(r.replica)
        if pod is None or pod.ip is None or pod.node != r.node or pod.name != pod_name(
                lm, r.replica):
            continue
        peer = PeerKey(lm.spec.model, lm.spec.engine.resolved_image(), r.tuning.threads,
                       cpu_model(obs.nodes.get(r.node)))
        out.append(SpeedTarget(lm.key, r.replica, r.node, pod.name, pod.uid, pod.ip, peer,
                               vouched=pod.gateway_image == own_image))
    return out


# node -> models: a tuple while a few (most nodes run one or two models; a
# set costs four times the memory of a small tuple: megabytes at 10 000
# nodes), a set beyond.
ByNode = dict[str, tuple[str, ...] | set[str]]
_FEW = 8


def index_node(by: ByNode, node: str, key: str) -> None:
    there = by.get(node)
    if there is None:
        by[node] = (key,)
    elif isinstance(there, set):
        there.add(key)
    elif key not in there:
        by[node] = (*there, key) if len(there) < _FEW else {*there, key}


def unindex_node(by: ByNode, node: str, key: str) -> None:
    there = by.get(node)
    if isinstance(there, set):
        there.discard(key)
    elif there is not None and key in there:
        there = tuple(k for k in there if k != key)
        by[node] = there
    if not there and there is not None:
        del by[node]


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

    def recount(self, statuses: Mapping[str, Any]) -> dict[tuple[str, ...], float]:
        """The tally after the statuses of these models changed (no model gone)."""
        counted = self.counted
        for key, status in statuses.items():
            kept = counted.get(key)
            if kept is None or kept[0] is not status:
                if kept is not None:
                    self._add(kept[1], -1)
                kept = counted[key] = (
                    status, tuple((c.type, c.status.value) for c in status.conditions))
                self._add(kept[1], 1)
        return {k: v for k, v in self.totals.items() if v}

    def _add(self, pairs: tuple[tuple[str, str], ...], n: int) -> None:
        for pair in pairs:
            self.totals[pair] = self.totals.get(pair, 0) + n
