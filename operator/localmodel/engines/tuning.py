"""An engine adapter's tuning part (engines/adapter.py): how the rules'
decisions are spelled for one engine.

The rules (operator/localmodel/rules/) decide *what*: threads = the CPU limit,
the context per slot and the slots, the KV cache type, flash attention, the
safe CPU path on AMX hosts. An engine's `EngineTuning` says *how* it is told
so: which command-line arguments, environment variables and Modelfile
parameters, and the words a decision's effect is recorded with. It works on
plain values (strings, numbers, version tuples) so that the engines import
neither the API models nor the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

Version = tuple[int, int, int]


@dataclass(frozen=True)
class Spelled:
    """One decision as an engine is told it: what it adds to the engine's
    command line (flag -> value, "" for a switch without a value, in
    command-line order), environment and Modelfile, and `how`, the words for
    the decision's recorded effect."""

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


class EngineTuning(Protocol):
    """How the rules' decisions are spelled for this engine."""

    # Where the weights volume is mounted in the engine container.
    models_volume: str
    # How "flash attention on" is said to it, for a decision's effect.
    flash_attention_on: str
    # CPU libraries that crash on AMX hosts in some versions, deleted at
    # container start by the amx rules (none: the engine has no such build).
    amx_libraries: tuple[str, ...]

    def threads(self, n: int) -> Spelled:
        """Run `n` threads (decode and prompt processing)."""
        ...

    def serving(self, serving: Serving) -> Spelled:
        """Serve one model with these slots and context per slot."""
        ...

    def safe_cpu_runner(self, version: Version | None) -> Spelled | None:
        """Choose the CPU runner without the AMX path, where this version can
        (None: it cannot be chosen by a setting)."""
        ...

    def metrics_on(self) -> Spelled | None:
        """Turn its own Prometheus metrics endpoint on (None: nothing to turn on)."""
        ...

    def prompt_cache(self, mib: int) -> Spelled:
        """Bound the earlier prompts' states it keeps in host memory to `mib`
        MiB (0: keep none)."""
        ...

    def web_ui_off(self) -> Spelled | None:
        """Turn its web UI off (None: it has none)."""
        ...

    def slots_endpoint_off(self) -> Spelled | None:
        """Turn off an endpoint that shows its slots' prompts (None: it has none)."""
        ...

    def command_line(
        self, args: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> tuple[str, ...]:
        """Its command line: the rules' flags plus the KV cache type and flash
        attention (`KVCacheType` and `FlashAttention` values), written in
        exactly one place."""
        ...

    def environment(
        self, env: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> dict[str, str]:
        """Its environment: the rules' variables plus whatever of the KV cache
        type and flash attention it reads from there, sorted by name."""
        ...
