"""An engine adapter's tuning part (engines/adapter.py): how the rules'
decisions are spelled for one engine.

The rules (operator/localmodel/rules/) decide *what*: threads = the CPU limit,
the context per slot and the slots, the KV cache type, flash attention, the
safe CPU path on AMX hosts. An engine's `EngineTuning` says *how* it is told
so: which command-line arguments, environment variables and Modelfile
parameters (a `Spelled`, rules/model.py), and the words a decision's effect is
recorded with. It works on plain values (strings, numbers). Here is what every
engine is asked: by the engine-neutral rules (rules/table.py), by its own
serving rule (`serving`, through `rules.steps.serve`) and by the evaluator
(`command_line`, `environment`); a decision only an engine's own rules make
(engines/<name>/rules.py) is spelled by a method of its own part, which they
call directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from localmodel.rules.model import Serving, Spelled


class EngineTuning(Protocol):
    """How the rules' decisions are spelled for this engine."""

    # Where the weights volume is mounted in the engine container.
    models_volume: str
    # How "flash attention on" is said to it, for a decision's effect.
    flash_attention_on: str

    def threads(self, n: int) -> Spelled:
        """Run `n` threads (decode and prompt processing)."""
        ...

    def serving(self, serving: Serving) -> Spelled:
        """Serve one model with these slots and context per slot."""
        ...

    def prompt_cache(self, mib: int) -> Spelled:
        """Bound the earlier prompts' states it keeps in host memory to `mib`
        MiB (0: keep none)."""
        ...

    def context_checkpoints(self, n: int) -> Spelled:
        """Keep at most `n` context checkpoints (copies of a slot's sliding-window
        cache) per slot."""
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
