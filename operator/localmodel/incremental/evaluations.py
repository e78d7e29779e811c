"""`rules.evaluate` memoized by value, for one pass (`Evaluations`)."""

from __future__ import annotations

from collections.abc import Hashable

from localmodel.api import LocalModelSpec
from localmodel.catalog import ModelShape
from localmodel.facts import NodeFacts
from localmodel.incremental.keys import node_key, spec_key
from localmodel.planner import Cpus
from localmodel.rules.evaluate import evaluate
from localmodel.rules.model import Tuning
from localmodel.versions import Version


class Evaluations:
    """Keeps each tuning for one pass, keyed on (spec as the pass reads it, node
    facts as `evaluate` reads them (`incremental.keys`), CPUs, shape, version).

    Saves the rules step (`rules.evaluate`) for every replica but the first of
    its key, and gives them all the same tuning object. For one pass (a caller
    keeps one per pass: nothing grows between passes). Held equal to
    `evaluate` by tests/controller/test_pass_memo.py
    (`test_what_the_rules_keys_leave_out_is_never_read`,
    `test_evaluations_give_one_tuning_per_distinct_input`)."""

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
