"""What the pass's memo layers key on: a spec and a node as far as the pass reads them.

One home for both readers: `Evaluations` (the rules), `PodParts` (a pod's
containers) and `AppliedDigests` (the applied objects) key a spec on
`spec_key`, and the first also a node on `node_key`. Many models share a spec
but for their names and placement, many nodes share a shape but for their
names and labels, so one pass does each distinct piece of work once.
Everything is read but what these name; a field added later is read (a finer
key is never wrong). tests/controller/test_pass_memo.py holds that what they leave
out is never read: by `prepare` and `evaluate`
(`test_what_the_rules_keys_leave_out_is_never_read`), by a pod's containers
(`test_a_pods_containers_read_neither_its_name_nor_its_node`) and by the
applied objects (`test_applied_digests_from_a_shared_template_are_the_manifest_hashes`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields
from operator import attrgetter
from typing import Any

from localmodel.api import LocalModelSpec, Placement
from localmodel.facts import NodeFacts

SPEC_NOT_READ = frozenset({"replicas", "cpu"})
PLACEMENT_READ = frozenset({"safe_cpu_path"})  # of spec.placement, only this
NODE_NOT_READ = frozenset({"name", "labels", "taints", "schedulable", "allocatable_memory_bytes"})
_NODE_READ = tuple(f.name for f in fields(NodeFacts) if f.name not in NODE_NOT_READ)
_SPEC_EXCLUDE: dict[str, Any] = {
    **dict.fromkeys(SPEC_NOT_READ, True),
    "placement": dict.fromkeys(set(Placement.model_fields) - PLACEMENT_READ, True),
}


def spec_key(spec: LocalModelSpec) -> str:
    """The spec as far as the pass reads it past placement (`prepare`, `evaluate`,
    a pod's containers, the applied objects), as JSON text (a string: its hash
    is computed once)."""
    return spec.model_dump_json(exclude=_SPEC_EXCLUDE)


def node_key(node: NodeFacts) -> Hashable:
    """The node's facts as far as `evaluate` reads them: a hashable value."""
    return _read_node(node)


_read_node = attrgetter(*_NODE_READ)  # (a tuple: more than one name is read)
assert len(_NODE_READ) > 1
