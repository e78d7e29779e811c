"""Evaluate the rules for one replica on one node: pure, ordered, recorded."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields
from operator import attrgetter
from typing import Any

from localmodel.api import LocalModelSpec, Placement
from localmodel.catalog import ModelShape, lookup
from localmodel.engines.registry import engine
from localmodel.errors import FieldError
from localmodel.facts import NodeFacts
from localmodel.planner.cpus import Cpus, cpu_limit, replica_cpus
from localmodel.rules.model import Context, Decision, Tuning, TuningDraft
from localmodel.rules.table import RULES
from localmodel.versions import Version, image_version, parse_version


def engine_version(spec: LocalModelSpec) -> Version | None:
    """spec.engine.version, else the image tag, else unknown."""
    if spec.engine.version:
        return parse_version(spec.engine.version)
    return image_version(spec.engine.resolved_image())


def problems(spec: LocalModelSpec) -> list[FieldError]:
    """What the schema cannot catch but the rules need (Valid=False when non-empty).

    Paths are rooted at the LocalModel, like `parse_local_model`'s.
    """
    return shape_problems(spec, lookup(spec.model, spec.model_info))


def shape_problems(spec: LocalModelSpec, shape: ModelShape | None) -> list[FieldError]:
    """`problems`, for a caller that has looked the model's shape up already."""
    found = []
    if spec.memory == "auto" and shape is None:
        found.append(
            FieldError(
                "spec.memory",
                f"model {spec.model!r} is not in the built-in catalog, so memory cannot be "
                "sized automatically: set spec.modelInfo (weightsSize, layers, kvHeads, "
                "keyLength, valueLength) or an explicit spec.memory",
            )
        )
    return found


def evaluate(
    spec: LocalModelSpec,
    node: NodeFacts,
    cpu: Cpus,
    shape: ModelShape | None = None,
    version: Version | None = None,
) -> Tuning:
    """Run every matching rule in order. `cpu` is what the planner decided for
    the replica (`planner.Assignment.cpu`)."""
    ctx = Context(spec=spec, node=node, cpu=cpu, shape=shape, version=version)
    draft = TuningDraft()
    decisions = []
    for rule in RULES:
        if not rule.matches(ctx):
            continue
        effect = rule.apply(ctx, draft)
        if effect is not None:
            decisions.append(Decision(rule.id, effect, rule.reason, rule.source))
    spelling = engine(ctx.engine).tuning
    return Tuning(
        threads=draft.threads,
        cpu=draft.cpu,
        memory_bytes=draft.memory_bytes,
        memory_parts=dict(draft.memory_parts),
        storage_bytes=draft.storage_bytes,
        env=spelling.environment(draft.env, draft.kv_cache.value, draft.flash_attention.value),
        modelfile=dict(draft.modelfile),
        args=spelling.command_line(draft.args, draft.kv_cache.value, draft.flash_attention.value),
        remove_libraries=tuple(draft.remove_libraries),
        flash_attention=draft.flash_attention,
        kv_cache=draft.kv_cache,
        decisions=tuple(decisions),
        warnings=tuple(draft.warnings),
    )


def tune(spec: LocalModelSpec, node: NodeFacts, cpu: int) -> Tuning:
    """evaluate() with the model shape and engine version resolved from the
    spec, for ``cpu`` whole CPUs taken on the node (the planner's decision of
    the replica's CPUs: `planner.replica_cpus`)."""
    cpus = replica_cpus(cpu_limit(node), cpu)
    return evaluate(spec, node, cpus, lookup(spec.model, spec.model_info), engine_version(spec))


# What `evaluate` reads, as hashable values, so that one pass evaluates each
# distinct (spec, node, cpu) once (`incremental.Evaluations`): many models
# share a spec but for their names and placement, many nodes share a shape but
# for their names and labels. Everything is read but what these name; a field
# added later is read (a finer key is never wrong). tests/unit/test_pass_memo.py
# holds that `evaluate` gives the same tuning to specs and nodes that differ
# only here.
SPEC_NOT_READ = frozenset({"replicas", "cpu"})
PLACEMENT_READ = frozenset({"safe_cpu_path"})  # of spec.placement, only this
NODE_NOT_READ = frozenset({"name", "labels", "taints", "schedulable", "allocatable_memory_bytes"})
_NODE_READ = tuple(f.name for f in fields(NodeFacts) if f.name not in NODE_NOT_READ)
_SPEC_EXCLUDE: dict[str, Any] = {
    **dict.fromkeys(SPEC_NOT_READ, True),
    "placement": dict.fromkeys(set(Placement.model_fields) - PLACEMENT_READ, True),
}


def spec_key(spec: LocalModelSpec) -> str:
    """The spec as far as `evaluate` (and `prepare`) read it, as JSON text (a
    string: its hash is computed once)."""
    return spec.model_dump_json(exclude=_SPEC_EXCLUDE)


def node_key(node: NodeFacts) -> Hashable:
    """The node's facts as far as `evaluate` reads them: a hashable value."""
    return _read_node(node)


_read_node = attrgetter(*_NODE_READ)  # (a tuple: more than one name is read)
assert len(_NODE_READ) > 1
