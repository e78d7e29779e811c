"""`rules.evaluate` memoized by value, for one pass."""

from __future__ import annotations

from collections.abc import Hashable

from localmodel.api import LocalModelSpec
from localmodel.catalog import ModelShape
from localmodel.facts import NodeFacts
from localmodel.planner import Cpus
from localmodel.rules.evaluate import evaluate, node_key, spec_key
from localmodel.rules.model import Tuning
from localmodel.versions import Version


class Evaluations:
    """`evaluate` memoized by value: the same tuning object for every call
    whose spec, node facts, CPUs, shape and version read the same (as far as
    `evaluate` reads them: `rules.spec_key`, `rules.node_key`). For one pass
    (a caller keeps one per pass: nothing grows between passes)."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, Tuning] = {}

    def __call__(
        self,
        spec: LocalModelSpec,
        node: NodeFacts,
        cpu: Cpus,
        shape: ModelShape | None,
        version: Version | None,
        key: Hashable | None = None,
    ) -> Tuning:
        """``key``: the spec's `spec_key`, when the caller has it."""
        memo = (spec_key(spec) if key is None else key, node_key(node), cpu, shape, version)
        found = self._seen.get(memo)
        if found is None:
            found = self._seen[memo] = evaluate(spec, node, cpu, shape, version)
        return found
