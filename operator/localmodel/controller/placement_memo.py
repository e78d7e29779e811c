"""The memo layers of the desired state's inputs from the watches: where each
replica is now, remembered placements filled in (`CurrentMemo`, keyed on the
current placements and the last placements of the unplaced replicas' models),
and which claim a replica takes on a node (`ClaimMemo`, keyed on the model, its
claims and pods, the node's facts and the claims' volumes). Pure;
tests/controller/test_pass_incremental.py holds a pass with them equal to one without.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from localmodel.api import LocalModel
from localmodel.controller.changes import choose_claim
from localmodel.controller.observed import Observed
from localmodel.controller.share_memo import ByNode, index_node, unindex_node
from localmodel.controller.since import Since

Current = Mapping[str, Sequence[str | None]]  # model -> replica's node (None: not placed)
Chooser = Callable[[LocalModel, int, str], str]  # `changes.choose_claim` of one Observed


@dataclass
class CurrentMemo:
    """Keeps the last `plan.with_memory` answer (where replicas are), keyed on
    what it was worked out from: the current placements and the last placements
    of unplaced replicas' models."""

    since: Since
    # The last `current`: its placements, the last placements it filled in from,
    # its answer, and the pass.
    memory: tuple[Any, dict[str, Any], Current, int] | None = None

    def current(self, current: Current, placed: Mapping[str, Mapping[int, str]],
                fill: Callable[[Current, Mapping[str, Mapping[int, str]]], Current]) -> Current:
        """`plan.with_memory` (`fill`), the same object again while `current` is
        the same and the last placements of its unplaced replicas' models are too;
        with only the changed models' entries (and those whose last placements
        changed) filled in again while the pods are the same and a few models
        changed (the same valid ones)."""
        last = self.memory
        if last is not None:
            moved = [k for k, then in last[1].items()  # (its unplaced replicas' last nodes)
                     if not ((was := placed.get(k)) is then or was == then)]
            if last[0] is current and not moved:
                self.memory = (*last[:3], self.since.passes)
                return last[2]
            changed = self.since.models_changed
            if (changed is not None and last[3] == self.since.passes - 1
                    and "pods" not in self.since.changed
                    and len(current) == len(last[0])
                    and all(k in last[0] for k in changed if k in current)):
                # The pods are the same, the same valid models: only the
                # changed models' entries, and those `moved`, can differ.
                part = {k: current[k] for k in (*changed, *moved) if k in current}
                out, unplaced = {**last[2], **fill(part, placed)}, dict(last[1])
                for k, nodes in part.items():
                    if None in nodes:
                        unplaced[k] = placed.get(k)
                    else:
                        unplaced.pop(k, None)
                self.memory = (current, unplaced, out, self.since.passes)
                return out
        filled = fill(current, placed)
        self.memory = (current, {k: placed.get(k) for k, nodes in current.items()
                                 if None in nodes}, filled, self.since.passes)
        return filled



@dataclass
class ClaimMemo:
    """Keeps the claims chosen (and by node), each keyed on what it read: the
    model, its claims and pods, the node's facts, the claims' volumes."""

    since: Since
    chosen: dict[tuple[str, int, str], tuple[Any, ...]] = field(default_factory=dict)
    # model -> (claim chosen for replica, node) keys, by node (`chooser`)
    chosen_on: ByNode = field(default_factory=dict)
    claims_again: set[str] | None = None  # models whose claims may be chosen otherwise

    def begin(self, before: Observed | None) -> None:
        """A new pass, after one on `before` (None: the first): while the claims,
        pods and volumes are the same, only the models on changed nodes may
        choose otherwise."""
        self.claims_again = None  # (the claims chosen read the model's claims, pods, volumes)
        if before is not None and not self.since.changed.intersection(
                ("claims", "pods", "volumes")):
            self.claims_again = set().union(*(self.chosen_on.get(node, ())
                                              for node in self.since.nodes_changed or ()))

    def chooser(self, obs: Observed) -> Chooser:
        """`changes.choose_claim` on `obs`, kept while what it reads is the same:
        the model, its claims and pods, the node's facts and the claims' volumes."""
        quick = not self.since.changed.intersection(("claims", "pods", "volumes"))
        nodes_same = "nodes" not in self.since.changed
        passes = self.since.passes

        def choose(lm: LocalModel, replica: int, node: str) -> str:
            key = lm.key
            kept = self.chosen.get((key, replica, node))
            # found to hold in the last pass, and only the model or the node may differ
            if (kept is not None and quick and kept[-1] == passes - 1 and kept[0] is lm
                    and (nodes_same or kept[3] == obs.nodes.get(node))):
                self.chosen[(key, replica, node)] = (*kept[:-1], passes)
                return cast(str, kept[-2])
            claims = obs.claims_of(key)
            read = (lm, claims, obs.pods_of(key), obs.nodes.get(node),
                    tuple(obs.volumes.get(c.volume or "") for c in claims))
            if kept is None:
                index_node(self.chosen_on, node, key)
            if kept is None or kept[:-2] != read:
                kept = (*read, choose_claim(lm, replica, node, obs), passes)
            self.chosen[(key, replica, node)] = (*kept[:-1], passes)
            return cast(str, kept[-2])
        return choose

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        for chosen in [k for k in self.chosen if k[0] not in keys]:
            del self.chosen[chosen]
            unindex_node(self.chosen_on, chosen[2], chosen[0])
