"""Keep, then place: the greedy pass over the index (see the package docstring)."""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping, Sequence

from localmodel.facts import NodeFacts
from localmodel.planner.assign import Pending, Undo, place_each
from localmodel.planner.explain import Explainer
from localmodel.planner.index import Node, NodeIndex
from localmodel.planner.inputs import PlannerInputs, Sameness
from localmodel.planner.keeping import BY_MODEL, Claim, Keeping, current_claims
from localmodel.planner.model import (
    DEFAULT_SETTINGS,
    ModelDemand,
    Plan,
    PlannerSettings,
    Unplaced,
    Usage,
)


def plan(
    models: Sequence[ModelDemand],
    nodes: Sequence[NodeFacts],
    current: Mapping[str, Sequence[str | None]] | None = None,
    usage: Mapping[str, Usage] | None = None,
    *,
    settings: PlannerSettings = DEFAULT_SETTINGS,
) -> Plan:
    """Place every replica of every model, keeping existing placements that still
    fit. See the package docstring for the rules, the order and the tie-break."""
    return Planner(settings, one_shot=True).plan(models, nodes, current or {}, usage or {})


class Planner:
    """Keeps the last plan, keyed on its inputs (demands, nodes, current
    placements, usage: `PlannerInputs`), over the kept state (`Keeping`); a call
    costs what changed.

    ``plan()`` that keeps its work between calls. The state after keeping
    (every node with the replicas kept on it) is kept in the node index, with
    a memo per node of the inputs keeping read there. A call re-keeps only the
    nodes whose facts, usage or current replicas changed, then places the
    replicas that must move on that state (undoing those placements at the
    start of the next call, so a call begins on the kept state and a planner
    used once never pays for the undoing), or returns the last plan when
    nothing changed. The index is rebuilt when its shape changes: nodes added,
    removed, cordoned or uncordoned, a new node selector or sidecar overhead,
    or a selector crossing the direct-search size. The result is always what a
    fresh ``plan()`` returns: held equal by tests/planner/test_incremental_plan.py
    (random sequences of changes)."""

    def __init__(
        self, settings: PlannerSettings = DEFAULT_SETTINGS, *, one_shot: bool = False
    ) -> None:
        self.settings = settings
        # One call only (`plan()`): the placements need not be undone afterwards.
        self.one_shot = one_shot
        self.rebuilds = 0  # how many calls built the index from scratch
        self.nodes_rekept = 0  # nodes re-kept by the last call
        # Models whose placements or explanations may differ from the plan
        # before the last call's (None: any model; a rebuild).
        self.touched: frozenset[str] | None = None
        self._inputs = PlannerInputs()
        self._keeping: Keeping | None = None
        self._explainer: Explainer | None = None
        self._shape: tuple[object, ...] = ()
        self._claims: dict[str, list[Claim]] = {}
        self._last: tuple[list[Pending], Plan] | None = None
        # The pending replicas that no node's keeping decides (no node yet, or
        # a node that is gone), valid while the demands, `current` and the node
        # names are those of the call that listed them.
        self._unheld: list[Pending] | None = None
        # The last call's placements to undo (and the nodes whose census counts
        # to redo), done at the start of the next call: `_restore`.
        self._undo: tuple[list[Undo], list[Node]] = ([], [])

    @property
    def nodes_by_name(self) -> Mapping[str, NodeFacts]:
        """The nodes of the last call, by name."""
        return self._inputs.by_name

    def plan(
        self,
        models: Sequence[ModelDemand],
        nodes: Sequence[NodeFacts],
        current: Mapping[str, Sequence[str | None]],
        usage: Mapping[str, Usage],
    ) -> Plan:
        self._restore()
        same = self._inputs.take(models, nodes, current, usage)
        rebuild = self._shape_changed(same.nodes_same)
        if (not rebuild and same.nodes_same and same.current_same and same.usage_same
                and self._last):
            self.nodes_rekept, self.touched = 0, frozenset()
            return self._last[1]
        touched: set[str] = set()
        changed, rebuild = self._keep_again(same, rebuild, current, usage, touched)
        if same.current_same and not rebuild and not changed and self._last is not None:
            return self._last[1]  # the same replicas on the same kept state
        pending = self._pending(current, rebuild or not same.current_same)
        if not rebuild and not changed and self._last is not None and self._last[0] == pending:
            return self._last[1]
        if not rebuild and self._last is not None:  # every replica placed afresh may move
            touched |= {d.key for d, _, _ in (*pending, *self._last[0])}
            self.touched = frozenset(touched)
        result = self._place_pending(pending)
        self._last = (pending, result)
        return result

    def _shape_changed(self, nodes_same: bool) -> bool:
        """Whether the index must be built again: none yet, a new shape, or
        (a new node list) other node names."""
        index = None if self._keeping is None else self._keeping.index
        if index is None or self._inputs.shape != self._shape:
            return True
        return not nodes_same and self._inputs.by_name.keys() != index.nodes.keys()

    def _keep_again(
        self,
        same: Sameness,
        rebuild: bool,
        current: Mapping[str, Sequence[str | None]],
        usage: Mapping[str, Usage],
        touched: set[str],
    ) -> tuple[list[Node], bool]:
        """Bring the kept state up to this call: re-keep the nodes whose inputs
        changed, or build the index again; the nodes re-kept, and whether it
        was built again. ``touched`` gains the models involved."""
        inputs = self._inputs
        by_name = inputs.by_name
        kept_claims = same.current_same and not rebuild  # (rebuilt: nodes may have gone)
        claims = self._claims if kept_claims else current_claims(inputs.order, current, by_name)
        changed: list[Node] = []
        relabelled: set[str] = set()
        if not rebuild:
            keeping = self._keeping
            assert keeping is not None
            suspects = keeping.suspects(
                by_name, same.refaced, (same.old_usage, usage), (self._claims, claims)
            )
            changed, relabelled = keeping.rekeep(by_name, suspects, usage, claims, touched)
            rebuild = bool(relabelled) and not keeping.index.views_hold(inputs.selectors)
        self._claims = claims
        if rebuild:
            self._rebuild(by_name, usage, claims)
            self._shape = inputs.shape
        self.nodes_rekept = len(by_name) if rebuild else len(changed)
        self.touched = None if rebuild or self._last is None else frozenset(touched)
        assert self._explainer is not None
        for node in changed:
            self._explainer.update(node, node.name in relabelled)
        return changed, rebuild

    def _pending(
        self, current: Mapping[str, Sequence[str | None]], relist: bool
    ) -> list[Pending]:
        """In the planner's order: replicas without a node, on a node that is
        gone, or on a node that keeping moved them off. The first two depend
        only on the demands, `current` and the node names, so they are listed
        again only when one of those changed (``relist``: a rebuild, or not
        the same current placements); the moved ones come from the nodes
        whose memo moves any."""
        keeping = self._keeping
        assert keeping is not None
        if relist or self._unheld is None:
            pending: list[Pending] = []
            unheld: list[Pending] = []
            by_name = self._inputs.by_name
            for d in self._inputs.order:
                was = current.get(d.key, ())
                for r in range(d.replicas):
                    name = was[r] if r < len(was) else None
                    if name is None:
                        unheld.append((d, r, ""))
                        pending.append((d, r, ""))
                    elif name not in by_name:
                        gone = (d, r, f"was on {name}: node is gone")
                        unheld.append(gone)
                        pending.append(gone)
                    else:
                        why = keeping.memo[name].moved.get((d.key, r))
                        if why is not None:
                            pending.append((d, r, why))
            self._unheld = unheld
            return pending
        pending = list(self._unheld)
        if keeping.moving:
            for name in keeping.moving:
                memo = keeping.memo[name]
                for d, r in memo.claims:
                    why = memo.moved.get((d.key, r))
                    if why is not None:
                        pending.append((d, r, why))
            rank = self._inputs.rank
            pending.sort(key=lambda p: (rank[p[0].key], p[1]))
        return pending

    def _restore(self) -> None:
        """Put the index back to the kept state: undo the last call's placements
        (and recount the censuses that counted them)."""
        undo, recount = self._undo
        if not undo:
            return
        self._undo = ([], [])
        keeping, explainer = self._keeping, self._explainer
        assert keeping is not None and explainer is not None
        index = keeping.index
        for u in undo:
            index.unindex(u.node)
            u.node.free_cpu_milli, u.node.free_memory = u.free_cpu_milli, u.free_memory
            u.node.occupants, u.node.exclusive_holder = u.occupants, u.exclusive_holder
            index.index(u.node)
        for node in recount:
            explainer.update(node)

    def _rebuild(
        self,
        by_name: Mapping[str, NodeFacts],
        usage: Mapping[str, Usage],
        claims: Mapping[str, list[Claim]],
    ) -> None:
        self.rebuilds += 1
        index = NodeIndex(self._inputs.order, list(by_name.values()), usage, self.settings)
        self._keeping, self._explainer = Keeping(index), Explainer(index)
        self._last = None
        self._unheld = None
        self._keeping.keep_all(by_name, usage, claims)

    def _place_pending(self, pending: list[Pending]) -> Plan:
        """Place the replicas that must move on the kept state and explain those
        that fit nowhere; the next call puts the index back to the kept state."""
        keeping, explainer = self._keeping, self._explainer
        assert keeping is not None and explainer is not None
        placed, unplaced, undo = place_each(keeping.index, pending, save=not self.one_shot)
        held: dict[str, list[str]] = {}
        for a in placed:
            held.setdefault(a.model, []).append(a.node)
        explained: tuple[Unplaced, ...] = ()
        if unplaced:
            touched = {id(u.node): u.node for u in undo}.values()
            for node in touched:
                explainer.update(node)
            explainer.held = {
                d.key: keeping.held.get(d.key, set()) | set(held.get(d.key, ()))
                for d, _ in unplaced
            }
            explained = tuple(
                explainer.explain(d, r)
                for d, r in sorted(unplaced, key=lambda dr: (dr[0].key, dr[1]))
            )
        explainer.forget_unused()
        # Back to the kept state, lazily: at the start of the next call (a
        # planner used for one pass, as a cold pass's is, never pays for it).
        self._undo = (undo, list(touched) if unplaced else [])
        placements = keeping.in_order()
        if len(placed) * 8 > len(placements):
            placements += placed
            placements.sort(key=BY_MODEL)
        else:
            for a in placed:
                insort(placements, a, key=BY_MODEL)
        return Plan(placements=tuple(placements), unplaced=explained, ordered=True)
