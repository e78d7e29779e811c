"""The tuning rules, in evaluation order. Each is data plus one small function.

A rule decides *what* (threads = the CPU limit, the context per slot, the KV
cache type, flash attention, the safe CPU path, memory); how its decision is
spelled for an engine (flags, variables, Modelfile parameters, the words of
its effect) is that engine's adapter's tuning part (engines/<name>/tuning.py,
asked through `engines.registry.engine`). The rules here are engine-neutral:
every registered engine takes part. An engine's own rules live in its package
(engines/<name>/rules.py, found through the registry) and run at the `Stage`
they name in `ORDER`; `rules_of` names each rule's engines (`Rule.engines`).

Each rule's `source` cites, separated by "; ", upstream files (`repo path`, or
`repo@version path` for a fact of one version), upstream issues and pull
requests (`repo#number`), each optionally with a note in parentheses, the project's own engine facts
(`docs/engine-facts.md#section`) or API fields (`spec.field`); a unit test
checks that every citation resolves. `docs/rules.md` is generated from this table
(`localmodel rules --write docs/rules.md`); never edit that file by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from localmodel.api import FlashAttention, KVCacheType
from localmodel.engines import llama_server, ollama
from localmodel.engines.registry import OWN_RULES, SHIPPED_NAMES, engine
from localmodel.facts.quantity import format_bytes, parse_bytes
from localmodel.rules.memory import (
    CONTEXT_CHECKPOINTS,
    MemoryBudget,
    kv_cells,
    memory_decision,
    model_kv_bytes,
)
from localmodel.rules.model import Context, Rule, Stage, TuningDraft
from localmodel.rules.steps import spell

GiB = 1024**3
MiB = 1024**2

# promptCache: auto keeps a quarter of the KV cache's size of earlier prompts'
# states: a few recent prompts come back cached, and the budget grows by a
# quarter of the KV term, not double (docs/engine-facts.md#the-prompt-cache-in-host-memory).
PROMPT_CACHE_SHARE_OF_KV = 4


def _ceil_gib(n: int) -> int:
    return -(-n // GiB) * GiB


# --- rule functions: return the effect they had, or None -------------------


def _set_threads(ctx: Context, s: TuningDraft, n: int) -> str:
    """Set the thread count where this engine reads it; returns how, for the effect."""
    s.cpu = s.threads = n
    return spell(s, engine(ctx.engine).tuning.threads(n))


def _threads(ctx: Context, s: TuningDraft) -> str | None:
    n = ctx.cpu.reserved
    return f"threads={n}: {_set_threads(ctx, s, n)}"


def _threads_cap(ctx: Context, s: TuningDraft) -> str | None:
    # The planner decided the cap (`planner.cpus.replica_cpus`); this records it.
    cpus = ctx.cpu
    if not cpus.capped_by:
        return None
    how = _set_threads(ctx, s, cpus.count)
    return f"threads {cpus.reserved} -> {cpus.count}: capped by the {cpus.capped_by} ({how})"


def _kv_needs_fa(ctx: Context, s: TuningDraft) -> str | None:
    if not s.kv_cache.quantized or s.flash_attention is not FlashAttention.AUTO:
        return None
    s.flash_attention = FlashAttention.ENABLED
    how = engine(ctx.engine).tuning.flash_attention_on
    return f"flash attention auto -> enabled ({how}) for kvCache {s.kv_cache.value}"


def _kv_fallback(ctx: Context, s: TuningDraft) -> str | None:
    if not s.kv_cache.quantized or s.flash_attention is not FlashAttention.DISABLED:
        return None
    before = s.kv_cache
    s.kv_cache = KVCacheType.F16
    s.warnings.append(f"kvCache {before.value} fell back to f16: flash attention is off here")
    return f"kvCache {before.value} -> f16: flash attention was turned off on this node"


def _kv_bytes(ctx: Context, s: TuningDraft) -> int | None:
    """The KV cache of context x slots in the draft's cache type (None: shape unknown)."""
    shape, spec = ctx.shape, ctx.spec
    if shape is None:
        return None
    return model_kv_bytes(shape, spec.context, spec.slots, s.kv_cache)


def _prompt_cache(ctx: Context, s: TuningDraft) -> str | None:
    asked, kv = ctx.spec.prompt_cache or "auto", _kv_bytes(ctx, s)
    if asked != "auto":
        size, why = parse_bytes(asked), "from spec"
    elif kv is not None:
        size = kv // PROMPT_CACHE_SHARE_OF_KV
        why = f"auto: a quarter of the KV cache of {ctx.spec.context}x{ctx.spec.slots} tokens"
    else:
        size, why = 0, "auto: off, the model's shape (and so its KV cache) is unknown"
    mib = -(-size // MiB)
    s.prompt_cache_bytes = mib * MiB
    how = spell(s, engine(ctx.engine).tuning.prompt_cache(mib))
    return f"prompt cache {format_bytes(s.prompt_cache_bytes)} ({why}): {how}"


def _checkpoints(ctx: Context, s: TuningDraft) -> str | None:
    how = spell(s, engine(ctx.engine).tuning.context_checkpoints(CONTEXT_CHECKPOINTS))
    return f"context checkpoints {CONTEXT_CHECKPOINTS} per slot: {how}"


def _budget(ctx: Context, s: TuningDraft) -> MemoryBudget | None:
    """The memory decision for the draft's settings (None: the shape is unknown).
    Flash attention `auto` counts as on: llama.cpp turns it on on CPU
    (docs/engine-facts.md#compute-buffer)."""
    if ctx.shape is None:
        return None
    return memory_decision(
        ctx.shape, context=ctx.spec.context, slots=ctx.spec.slots,
        kv_cache=s.kv_cache, flash_attention=s.flash_attention is not FlashAttention.DISABLED,
        prompt_cache_bytes=s.prompt_cache_bytes)


def _kv_words(ctx: Context, s: TuningDraft) -> str:
    shape, spec = ctx.shape, ctx.spec
    words = f"{spec.context}x{spec.slots} tokens, {s.kv_cache.value}"
    if shape is None or not shape.sliding_window:
        return words
    _, window = kv_cells(shape, spec.context, spec.slots)
    full = shape.layers if shape.global_layers is None else min(shape.global_layers,
                                                                shape.layers)
    return (f"{words}; {shape.layers - full} of {shape.layers} layers at a "
            f"{window}-cell sliding window per slot")


def _memory_auto(ctx: Context, s: TuningDraft) -> str | None:
    budget = _budget(ctx, s)
    if ctx.spec.memory != "auto" or budget is None:
        return None
    s.memory_parts = budget.parts()
    s.memory_bytes = budget.total
    fa = "on" if s.flash_attention is not FlashAttention.DISABLED else "off"
    assumed = f"; assumed ({'; '.join(budget.assumed)})" if budget.assumed else ""
    return (
        f"memory {format_bytes(s.memory_bytes)} = weights {format_bytes(budget.weights)}"
        f" + KV cache {format_bytes(budget.kv_cache)} ({_kv_words(ctx, s)})"
        f" + prompt cache {format_bytes(budget.prompt_cache)}"
        f" + context checkpoints {format_bytes(budget.checkpoints)}"
        f" + compute {format_bytes(budget.compute)} (flash attention {fa})"
        f" + runtime {format_bytes(budget.runtime)}{assumed}"
    )


def _memory_explicit(ctx: Context, s: TuningDraft) -> str | None:
    if ctx.spec.memory == "auto":
        return None
    s.memory_bytes = parse_bytes(ctx.spec.memory)
    s.memory_parts = {"spec": s.memory_bytes}
    budget = _budget(ctx, s)
    if budget is None:
        return f"memory {ctx.spec.memory} from spec (model not in the catalog: no estimate)"
    estimate = budget.total - budget.kv_cache
    if s.memory_bytes < estimate:
        s.warnings.append(
            f"memory {ctx.spec.memory} is below the weights + prompt cache + compute + "
            f"runtime estimate {format_bytes(estimate)}: the engine may be OOM-killed"
        )
        return f"memory {ctx.spec.memory} from spec, below the estimate {format_bytes(estimate)}"
    return f"memory {ctx.spec.memory} from spec"


def _guaranteed(ctx: Context, s: TuningDraft) -> str | None:
    # The renderer always writes requests = limits; this rule records why.
    return f"requests = limits: cpu {s.cpu}, memory {format_bytes(s.memory_bytes)}"


def _volume(ctx: Context, s: TuningDraft) -> str | None:
    at = engine(ctx.engine).tuning.models_volume
    if ctx.spec.storage.size is not None:
        s.storage_bytes = parse_bytes(ctx.spec.storage.size)
        return f"volume {ctx.spec.storage.size} at {at} (from spec)"
    # Weights never exceed the memory limit (no mmap on CPU), so without a
    # known size the limit bounds them.
    weights = ctx.shape.weights_bytes if ctx.shape is not None else s.memory_bytes
    # Twice the weights: an updated tag's new blobs land before the old are pruned.
    s.storage_bytes = _ceil_gib(2 * weights + GiB)
    return f"volume {format_bytes(s.storage_bytes)} at {at} (2 x weights + 1Gi)"


# The evaluation order: the engine-neutral rules, and at each `Stage` every
# engine's own rules for it (its package's `RULES`, engines in the registry's order).
ORDER: tuple[Rule | Stage, ...] = (
    Rule(
        id="threads-from-cpu-limit",
        title="Threads equal the CPU limit",
        effect="threads = whole CPUs of the limit: Ollama num_thread (Modelfile PARAMETER) "
        "and GOMAXPROCS; llama-server -t and -tb",
        reason="engines default to one thread per host core; on a CPU quota decode collapses "
        "(0.27 vs 12.07 tok/s at 8 vs 4 threads on 4 CPUs; more than 379x at 8 threads on a "
        "1-CPU quota here)",
        source="ollama#17916; llama.cpp common/common.cpp (common_cpu_get_num_math); "
        "llama.cpp common/arg.cpp (-t, -tb); ollama api/types.go; "
        "docs/engine-facts.md#threads-from-the-modelfile; "
        "docs/engine-facts.md#llama-server-default-thread-count; "
        "docs/benchmarks.md#the-thread-rule-benchmarksthreadspy",
        apply=_threads,
    ),
    Rule(
        id="threads-capped-by-node",
        title="Threads never exceed the node or cpuset",
        effect="threads and CPU limit lowered to the node's allocatable CPUs, cpuset or quota",
        reason="more threads than CPUs to run them on oversubscribes the busy-wait barrier",
        source="docs/engine-facts.md#llama-server-default-thread-count; "
        "docs/engine-facts.md#oversubscription; ollama#17916",
        apply=_threads_cap,
        spec_condition="threads > allocatable CPUs, cpuset or cgroup quota",
    ),
    Stage.SERVING,
    Rule(
        id="kv-cache-quantized-enables-flash-attention",
        title="A quantized KV cache turns flash attention on",
        effect="flashAttention auto -> enabled (OLLAMA_FLASH_ATTENTION=1; llama-server -fa on)",
        reason="a quantized V cache needs flash attention; without it Ollama <= 0.24 silently "
        "falls back to f16 and >= 0.30 fails to load (HTTP 500), as llama-server does; "
        ">= 0.30's auto already enables it on CPU, so the explicit value keeps it on",
        source="docs/engine-facts.md#quantized-kv-cache; llama.cpp src/llama-context.cpp "
        "(quantized V cache requires flash_attn); ollama@v0.24.0 llm/server.go; "
        "ollama llm/llama_server.go; ollama#13337",
        apply=_kv_needs_fa,
        spec_condition="kvCache q8_0/q4_0 and flashAttention auto",
    ),
    Stage.CPU_PATH,
    Rule(
        id="kv-cache-falls-back-to-f16",
        title="KV cache falls back to f16 when flash attention is off",
        effect="kvCache -> f16, with a warning",
        reason="a quantized V cache cannot be created without flash attention: Ollama >= 0.30 "
        "fails to load the model (HTTP 500), <= 0.24 silently uses f16",
        source="docs/engine-facts.md#quantized-kv-cache; llama.cpp src/llama-context.cpp; "
        "ollama@v0.24.0 llm/server.go",
        apply=_kv_fallback,
        spec_condition="kvCache quantized and flash attention turned off by a rule",
    ),
    Rule(
        id="prompt-cache-bounded",
        title="The host-memory prompt cache is bounded",
        effect="prompt cache = spec.promptCache, or with auto a quarter of the KV cache's "
        "size (0 when the model's shape is unknown), in whole MiB: llama-server --cache-ram; "
        "Ollama LLAMA_ARG_CACHE_RAM, inherited by its llama-server child",
        reason="llama-server keeps earlier prompts' states in host memory up to 8192 MiB by "
        "default, about 30 MiB per 2,300-token prompt of the 270M test model: unbounded, a "
        "pod grows with every distinct prompt until it is OOM-killed",
        source="docs/engine-facts.md#the-prompt-cache-in-host-memory; "
        "llama.cpp common/common.h (cache_ram_mib); llama.cpp common/arg.cpp (--cache-ram); "
        "llama.cpp#16391; ollama llm/llama_server.go; spec.promptCache",
        apply=_prompt_cache,
    ),
    Rule(
        id="context-checkpoints-bounded",
        title="The context checkpoints are bounded",
        effect=f"{CONTEXT_CHECKPOINTS} context checkpoints per slot: llama-server "
        "--ctx-checkpoints; Ollama LLAMA_ARG_CTX_CHECKPOINTS, inherited by its llama-server "
        "child",
        reason="for a sliding-window model llama-server copies the slot's sliding-window "
        "cache into host memory while it reads a prompt, up to 32 copies per slot by default "
        "(Gemma 3 4B at 4k: 174 MiB each, 5.4 GiB in all): two are the ones a prompt makes "
        "near its end, which the next turn of a chat restores, and the memory decision "
        "counts them",
        source="docs/engine-facts.md#context-checkpoints; llama.cpp common/common.h "
        "(n_ctx_checkpoints); llama.cpp common/arg.cpp (--ctx-checkpoints); "
        "llama.cpp tools/server/server-context.cpp (create_checkpoint)",
        apply=_checkpoints,
    ),
    Rule(
        id="memory-from-weights-and-kv",
        title="Memory sized from the model's shape, as the engine allocates",
        effect="memory = weights + KV cache (whole-context layers at context x slots, "
        "sliding-window layers at the window + one micro-batch per slot, in the cache "
        "type) + prompt cache + context checkpoints (a sliding-window model's window cells "
        "per slot, per checkpoint) + compute (the attention masks, the larger of the attention "
        "step, n_head x per-slot context x micro-batch x 4 B without flash attention, and "
        "the feed-forward step, the logits; the CPU work buffer, without flash attention "
        "the scores again in f16) + runtime (128Mi); "
        "an unknown head count, hidden size, feed-forward width or vocabulary is bounded, "
        "and said",
        reason="an under-estimate is an OOM kill at the first long prompt, an over-estimate "
        "a node's memory wasted every day: without flash attention the compute buffer of "
        "Qwen3 8B at 32k is 2156 MiB, with it 136 MiB; Gemma 3 keeps five of six layers at "
        "its window; the formula is at or above llama-server's own accounting at 72 "
        "measured points, by at most 19 MiB",
        source="docs/engine-facts.md#weights-in-memory; docs/engine-facts.md#kv-cache-size; "
        "docs/engine-facts.md#sliding-window-kv-cache; docs/engine-facts.md#compute-buffer; "
        "docs/engine-facts.md#runtime; docs/engine-facts.md#the-prompt-cache-in-host-memory; "
        "docs/engine-facts.md#context-checkpoints; "
        "llama.cpp src/llama-kv-cache.cpp; llama.cpp src/llama-kv-cache-iswa.cpp; "
        "llama.cpp src/llama-context.cpp (sched_reserve); llama.cpp src/llama-graph.cpp "
        "(build_attn_mha); llama.cpp ggml/src/ggml-alloc.c; "
        "llama.cpp ggml/src/ggml-cpu/ggml-cpu.c (ggml_graph_plan: the work buffer)",
        apply=_memory_auto,
        spec_condition="memory: auto",
    ),
    Rule(
        id="memory-from-spec",
        title="Explicit memory, checked against the estimate",
        effect="memory = spec.memory; a warning when it is below weights + prompt cache "
        "+ context checkpoints "
        "+ compute + runtime",
        reason="an explicit limit below the weights gets the engine OOM-killed at load",
        source="docs/engine-facts.md#memory-budget; docs/engine-facts.md#compute-buffer",
        apply=_memory_explicit,
        spec_condition="memory set",
    ),
    Rule(
        id="guaranteed-qos",
        title="Guaranteed QoS with whole CPUs",
        effect="requests = limits for every container; integer CPUs for the engine",
        reason="the static CPU manager gives exclusive cores only to Guaranteed pods with "
        "integer CPUs; a burstable engine shares cores and its barrier stalls",
        source="docs/engine-facts.md#cpu-budget; kubernetes#127525",
        apply=_guaranteed,
    ),
    Rule(
        id="weights-volume",
        title="Weights on a persistent volume",
        effect=f"a PVC per replica at {ollama.HOME} (Ollama) or {llama_server.MODELS_DIR} "
        "(llama-server); the init step downloads only when the weights are missing",
        reason="without it every restart downloads gigabytes again",
        source="docs/engine-facts.md#weights-on-a-volume; "
        "docs/engine-facts.md#weights-imported-once-offline; ollama envconfig/config.go",
        apply=_volume,
    ),
    Stage.SWITCHES,
)


def rules_of(own: Mapping[str, Mapping[Stage, Sequence[Rule]]]) -> tuple[Rule, ...]:
    """The rules in evaluation order for these engines (name -> its own rules by
    stage, in the registry's order): each neutral rule for all of them, each
    engine's own for it alone."""
    every = frozenset(own)
    out: list[Rule] = []
    for step in ORDER:
        if isinstance(step, Stage):
            out += [replace(r, engines=frozenset({name}))
                    for name, stages in own.items() for r in stages.get(step, ())]
        else:
            out.append(replace(step, engines=every))
    return tuple(out)


# Every registered engine's rules (what the evaluator runs), and the shipped
# engines' (what docs/rules.md lists: an out-of-tree engine does not enter it).
RULES: tuple[Rule, ...] = rules_of(OWN_RULES)
SHIPPED_RULES: tuple[Rule, ...] = rules_of({n: OWN_RULES[n] for n in SHIPPED_NAMES})
RULES_BY_ID = {r.id: r for r in RULES}
