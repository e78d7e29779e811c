"""Ollama's own rules (rules/table.py runs them at their `Stage`): its serving
decision, and the AMX guards over its CPU libraries (AMX is Ollama's concern:
its facts' `AMX_LIBRARIES`; docs/engine-facts.md#amx). The table names this
engine as theirs."""

from __future__ import annotations

from localmodel.api import FlashAttention
from localmodel.engines.ollama import (
    AMX_FIXED_IN,
    AMX_LIBRARIES,
    AMX_LIBRARY,
    AMX_VARIANT_BACK,
    HOME,
)
from localmodel.engines.ollama.tuning import OllamaTuning
from localmodel.rules.model import (
    UBATCH,
    Context,
    CpuCondition,
    Rule,
    Stage,
    TuningDraft,
    VersionRange,
)
from localmodel.rules.steps import AMX_FLAGS, safe_side_note, serve, spell

_TUNING = OllamaTuning()
AMX = CpuCondition(AMX_FLAGS, unknown=True)


def _serving(ctx: Context, s: TuningDraft) -> str | None:
    return serve(ctx, s, _TUNING.serving)


def _micro_batch(ctx: Context, s: TuningDraft) -> str | None:
    return spell(s, _TUNING.micro_batch(UBATCH))


def _amx_safe_path(ctx: Context, s: TuningDraft) -> str:
    changes = []
    if s.flash_attention is not FlashAttention.DISABLED:
        changes.append(f"flash attention {s.flash_attention.value} -> disabled")
        s.flash_attention = FlashAttention.DISABLED
    runner = _TUNING.safe_cpu_runner(ctx.version)
    if runner is not None:
        changes.append(spell(s, runner))
    return ", ".join(changes)


def _amx_guard(ctx: Context, s: TuningDraft) -> str | None:
    return _amx_safe_path(ctx, s) + safe_side_note(ctx)


def _amx_forced(ctx: Context, s: TuningDraft) -> str | None:
    if not ctx.spec.placement.safe_cpu_path:
        return None
    effect = _amx_safe_path(ctx, s)
    return effect + f", remove {_remove_amx_libraries(s)} at start" + safe_side_note(ctx)


def _remove_amx_libraries(s: TuningDraft) -> str:
    """Delete the AMX-crashing CPU libraries at start; which, for the effect."""
    s.remove_libraries += [lib for lib in AMX_LIBRARIES if lib not in s.remove_libraries]
    return " ".join(AMX_LIBRARIES)


def _amx_library(ctx: Context, s: TuningDraft) -> str | None:
    return f"remove {_remove_amx_libraries(s)} at container start" + safe_side_note(ctx)


RULES: dict[Stage, tuple[Rule, ...]] = {
    Stage.SERVING: (
        Rule(
            id="one-model-per-pod",
            title="One model per pod, one slot with the full context",
            effect="OLLAMA_MAX_LOADED_MODELS=1, OLLAMA_NUM_PARALLEL=slots, "
            "OLLAMA_CONTEXT_LENGTH=context, OLLAMA_KEEP_ALIVE=keepAlive, OLLAMA_MODELS under "
            f"{HOME}, engine bound to loopback behind the gateway",
            reason="defaults load up to 3 models on CPU and a 4096 context; models sharing a "
            "pod split memory, slots and cores",
            source="ollama envconfig/config.go; docs/engine-facts.md#ollama-defaults-on-cpu",
            apply=_serving,
        ),
        Rule(
            id="ollama-micro-batch-pinned",
            title="The micro-batch the memory decision counts",
            effect=f"Modelfile PARAMETER num_batch {UBATCH} (its llama-server child's -b and -ub)",
            reason="Ollama 0.34 picks its child's batch from the context of all slots and the "
            "machine's free memory (1024 above 4096 tokens, 2048 above 32768), which a pod's "
            "limit cannot follow, and the compute buffer grows with it: Gemma 3 1B at 8k "
            "without flash attention has 192 MiB of compute buffer at 1024 against 63 at 512, "
            "and its filled 8k prompt was OOM-killed under a decision made for 512; "
            "llama-server's own micro-batch default is 512",
            source="docs/engine-facts.md#compute-buffer; ollama server/sched.go "
            "(automaticGenerationBatch, generationBatchForContext); ollama server/routes.go "
            "(usesAutomaticNumBatch); ollama llm/llama_server.go (appendBatchArgs)",
            apply=_micro_batch,
        ),
    ),
    Stage.CPU_PATH: (
        Rule(
            id="amx-guard",
            title="AMX guard for engine builds before 0.30",
            effect="flash attention off (OLLAMA_FLASH_ATTENTION=0); before 0.5.12 also "
            "OLLAMA_LLM_LIBRARY=cpu_avx2",
            reason="an Ollama build before 0.30 crashed on AMX CPUs in its AMX / flash-attention "
            "path; turning flash attention off avoided it. Only runners before 0.5.12 can be "
            "chosen by OLLAMA_LLM_LIBRARY; 0.30-0.32.1 need the library removed instead",
            source="docs/engine-facts.md#amx; docs/engine-facts.md#ollama_llm_library; "
            "ollama@v0.5.7 llm/server.go; ollama@v0.24.0 discover/runner.go",
            apply=_amx_guard,
            versions=VersionRange(high=AMX_VARIANT_BACK, unknown=True),
            cpu=AMX,
        ),
        Rule(
            id="amx-remove-cpu-variant",
            title="Remove the crashing sapphirerapids CPU variant",
            effect=f"delete {AMX_LIBRARY} at container start",
            reason="0.30.0-0.32.1 ship a sapphirerapids variant that segfaults on AMX hosts; "
            "OLLAMA_LLM_LIBRARY does not choose a CPU variant in these versions",
            source="ollama#17205; ollama#17006; ollama#17249; ollama#17236; ollama#17244; "
            "llama.cpp ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp; ollama discover/runner.go; "
            "docs/engine-facts.md#amx",
            apply=_amx_library,
            versions=VersionRange(low=AMX_VARIANT_BACK, high=AMX_FIXED_IN, unknown=True),
            cpu=AMX,
        ),
        Rule(
            id="amx-safe-path-forced",
            title="Admin-forced safe CPU path",
            effect=f"flash attention off, delete {AMX_LIBRARY}; before 0.5.12 also "
            "OLLAMA_LLM_LIBRARY=cpu_avx2",
            reason="the admin asked for the safe path on AMX nodes whatever the engine version",
            source="docs/engine-facts.md#amx; docs/engine-facts.md#ollama_llm_library; "
            "spec.placement.safeCpuPath",
            apply=_amx_forced,
            cpu=AMX,
            spec_condition="placement.safeCpuPath: true",
        ),
    ),
}
