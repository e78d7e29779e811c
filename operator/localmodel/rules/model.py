"""The shapes rules are made of: conditions as data, a context, a mutable
draft, a decision as an engine is told it (`Spelled`), the outcome (`Tuning`).

They sit below the engine adapters, which spell a decision and declare their
own rules (engines/<name>/rules.py), and below the rules table and evaluator
(rules/table.py, rules/evaluate.py), which ask the adapters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from localmodel.api import EngineName, FlashAttention, KVCacheType, LocalModelSpec
from localmodel.catalog import ModelShape
from localmodel.facts import NodeFacts
from localmodel.planner.cpus import Cpus
from localmodel.versions import Version, show_version

# llama-server's micro-batch when the pod renders none (llama.cpp's `-ub` default,
# common/common.h n_ubatch), and Ollama's as the operator pins it (rule
# ollama-micro-batch-pinned: its own would follow the context and free memory); the
# memory decision counts it (rules/memory.py).
UBATCH = 512


@dataclass(frozen=True)
class VersionRange:
    """Engine versions a rule applies to: `low <= v < high`."""

    low: Version | None = None
    high: Version | None = None
    unknown: bool = True  # an unknown version matches (the safe side for guards)

    def matches(self, v: Version | None) -> bool:
        if v is None:
            return self.unknown
        return (self.low is None or v >= self.low) and (self.high is None or v < self.high)

    def describe(self) -> str:
        parts = []
        if self.low:
            parts.append(f">= {show_version(self.low)}")
        if self.high:
            parts.append(f"< {show_version(self.high)}")
        text = " and ".join(parts) or "any"
        return text + (" or unknown" if self.unknown and parts else "")


@dataclass(frozen=True)
class CpuCondition:
    """Node CPU features a rule applies to: any of `flags`."""

    flags: frozenset[str]
    unknown: bool = True  # features not known (no NFD/probe labels) match

    def matches(self, node: NodeFacts) -> bool:
        # Per flag: a source may vouch for some flags and not others (NFD leaves
        # some unlabelled by default), so "not labelled" can mean "unknown".
        seen = [node.has(f) for f in sorted(self.flags)]
        if any(s is True for s in seen):
            return True
        return self.unknown and any(s is None for s in seen)

    def describe(self) -> str:
        text = "CPU has any of " + ", ".join(sorted(self.flags))
        return text + (" (or features unknown)" if self.unknown else "")


@dataclass(frozen=True)
class Spelled:
    """One decision as an engine is told it: what it adds to the engine's
    command line (flag -> value, "" for a switch without a value, in
    command-line order), environment and Modelfile, and `how`, the words for
    the decision's recorded effect (an adapter's tuning part, engines/tuning.py)."""

    how: str
    args: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    modelfile: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Serving:
    """What a pod serves, as the serving rule decides it: one model, `slots`
    parallel slots of `context` tokens each, bound to loopback behind the
    gateway."""

    model: str
    weights_file: str | None  # the GGUF's file name on the weights volume (spec.gguf)
    context: int  # tokens per slot
    slots: int
    keep_alive: str
    behind_gateway: bool

    @property
    def bind(self) -> str:
        """The address the engine listens on: loopback behind the gateway."""
        return "127.0.0.1" if self.behind_gateway else "0.0.0.0"


class Stage(StrEnum):
    """Where an engine's own rules (engines/<name>/rules.py) run among the
    engine-neutral ones (rules/table.py `ORDER`), each engine's in the
    registry's order."""

    SERVING = "serving"  # after the thread count: the model, its slots and context
    CPU_PATH = "cpu path"  # once flash attention is settled, before the KV fallback reads it
    SWITCHES = "switches"  # last: the engine's own switches


@dataclass(frozen=True)
class Context:
    """Everything a rule may look at. Pure values."""

    spec: LocalModelSpec
    node: NodeFacts
    cpu: Cpus  # what the planner decided for this replica (the rules only read it)
    shape: ModelShape | None
    version: Version | None

    @property
    def engine(self) -> EngineName:
        return self.spec.engine.name


@dataclass
class TuningDraft:
    """What the rules decide, built up in rule order (mutable); `evaluate`
    freezes it into a `Tuning`."""

    threads: int = 0
    cpu: int = 0
    env: dict[str, str] = field(default_factory=dict)
    modelfile: dict[str, str] = field(default_factory=dict)
    # llama-server flags in command-line order; "" marks a switch without a value.
    args: dict[str, str] = field(default_factory=dict)
    flash_attention: FlashAttention = FlashAttention.AUTO
    kv_cache: KVCacheType = KVCacheType.F16
    remove_libraries: list[str] = field(default_factory=list)
    prompt_cache_bytes: int = 0  # the engine's host-memory prompt cache bound
    memory_bytes: int = 0
    memory_parts: dict[str, int] = field(default_factory=dict)
    storage_bytes: int = 0
    startup_seconds: int = 0  # how long the startup probe lets the load take (0: not decided)
    warnings: list[str] = field(default_factory=list)


RuleAction = Callable[[Context, TuningDraft], str | None]


@dataclass(frozen=True)
class Rule:
    """One tuning rule. Conditions are data (they generate the docs); `apply`
    checks what only the spec can tell, changes the draft and returns the
    effect it had, or None when it does not apply."""

    id: str
    title: str
    effect: str  # what it does, for the docs
    reason: str  # one line: why
    source: str  # where the engine fact comes from (citations, see rules/table.py)
    apply: RuleAction
    # The engines it is for: set by the table (rules/table.py `rules_of`), every
    # registered engine for its own rules, the engine's own for an engine's.
    engines: frozenset[str] = frozenset()
    versions: VersionRange | None = None
    cpu: CpuCondition | None = None
    families: frozenset[str] | None = None
    spec_condition: str = ""  # the spec-level condition `apply` checks, for the docs

    def matches(self, ctx: Context) -> bool:
        if ctx.engine not in self.engines:
            return False
        if self.versions is not None and not self.versions.matches(ctx.version):
            return False
        if self.cpu is not None and not self.cpu.matches(ctx.node):
            return False
        return not (
            self.families is not None
            and (ctx.shape is None or ctx.shape.family not in self.families)
        )

    def when(self) -> str:
        parts = ["engine " + "/".join(sorted(self.engines))]
        if self.versions is not None:
            parts.append("version " + self.versions.describe())
        if self.cpu is not None:
            parts.append(self.cpu.describe())
        if self.families is not None:
            parts.append("family " + "/".join(sorted(self.families)))
        if self.spec_condition:
            parts.append(self.spec_condition)
        return "; ".join(parts)


@dataclass(frozen=True)
class Decision:
    """A rule that fired: what it changed and why. Rendered into status and events."""

    rule: str
    effect: str
    reason: str
    source: str


@dataclass(frozen=True)
class Tuning:
    """The engine settings for one replica on one node, and the decisions behind them."""

    threads: int
    cpu: int
    memory_bytes: int
    memory_parts: dict[str, int]
    storage_bytes: int
    env: dict[str, str]
    modelfile: dict[str, str]
    args: tuple[str, ...]  # llama-server's command line; () for Ollama
    remove_libraries: tuple[str, ...]
    flash_attention: FlashAttention
    kv_cache: KVCacheType
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...]
    # How long the startup probe lets the model's load take (podspec.startup_bound_seconds);
    # 0 where no rule decided one (the engine's pod then keeps the floor).
    startup_seconds: int = 0
