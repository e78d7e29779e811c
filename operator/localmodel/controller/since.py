"""What changed since the last pass (`Since`): which sections of the `Observed`
are other objects, which models' stored objects and which nodes' facts. Pure.

Every memo layer of a pass's plan (work_memo.py) asks this one answer, worked
out once per pass from the identity of the sections and objects `observe`
hands back (the same object for what did not change).
"""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.controller.observed import Observed, changed_keys

# The sections of an `Observed` the memo layers read; `observe` hands back the
# same object for a section none of whose objects changed.
SECTIONS = ("models", "nodes", "pods", "claims", "objects", "volumes", "storage_classes")


@dataclass
class Since:
    """The last pass's `Observed`, and what of this pass's is not its."""

    passes: int = 0  # `begin` counts them
    obs: Observed | None = None  # this pass's (the last one's, until `begin`)
    changed: frozenset[str] = frozenset(SECTIONS)  # sections this pass's `obs` changed
    # The models whose stored object is not the last pass's (None: not known,
    # or models came or went).
    models_changed: frozenset[str] | None = None
    # The nodes whose facts are not the last pass's (None: not known, or the
    # pods changed too: what reads nodes is read again instead).
    nodes_changed: frozenset[str] | None = None

    def begin(self, obs: Observed) -> Observed | None:
        """A new pass on `obs`: what is not the last pass's. Returns the last `Observed`."""
        before, self.obs, self.passes = self.obs, obs, self.passes + 1
        self.changed = frozenset(SECTIONS) if before is None else frozenset(
            s for s in SECTIONS if getattr(obs, s) is not getattr(before, s))
        self.models_changed = None
        if before is not None:
            self.models_changed = frozenset() if before.models is obs.models else changed_keys(
                before.models, obs.models)
        self.nodes_changed = None
        if before is not None and "pods" not in self.changed:
            old, new = before.nodes, obs.nodes
            since = obs.nodes_since  # (`observe` read a few nodes again: those)
            self.nodes_changed = frozenset() if old is new else since[1] if (
                since is not None and since[0] is old) else frozenset(
                n for n in old.keys() | new.keys() if old.get(n) is not new.get(n))
        return before
