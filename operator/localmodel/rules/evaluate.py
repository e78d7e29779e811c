"""Evaluate the rules for one replica on one node: pure, ordered, recorded."""

from __future__ import annotations

from localmodel.api import LocalModelSpec
from localmodel.api.idle import unknown_time_zones
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
    found.extend(unknown_time_zones(spec.idle))  # (the API server has no zone database)
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
        startup_seconds=draft.startup_seconds,
    )


def tune(spec: LocalModelSpec, node: NodeFacts, cpu: int) -> Tuning:
    """evaluate() with the model shape and engine version resolved from the
    spec, for ``cpu`` whole CPUs taken on the node (the planner's decision of
    the replica's CPUs: `planner.replica_cpus`)."""
    cpus = replica_cpus(cpu_limit(node), cpu)
    return evaluate(spec, node, cpus, lookup(spec.model, spec.model_info), engine_version(spec))
