"""The tuning rules, in evaluation order. Each is data plus one small function.

A rule decides *what* (threads = the CPU limit, the context per slot, the KV
cache type, flash attention, the safe CPU path, memory); how its decision is
spelled for an engine (flags, variables, Modelfile parameters, the words of
its effect) is that engine's adapter's tuning part (engines/<name>/tuning.py,
asked through `engines.registry.engine`). A rule for some engines only names
them (`Rule.engines`).

Each rule's `source` cites, separated by "; ", upstream files (`repo path`, or
`repo@version path` for a fact of one version), upstream issues and pull
requests (`repo#number`), each optionally with a note in parentheses, the project's own engine facts
(`docs/engine-facts.md#section`) or API fields (`spec.field`); a unit test
checks that every citation resolves. `docs/rules.md` is generated from this table
(`localmodel rules --write docs/rules.md`); never edit that file by hand.
"""

from __future__ import annotations

from fractions import Fraction

from localmodel.api import EngineName, FlashAttention, KVCacheType
from localmodel.engines import llama_server, ollama
from localmodel.engines.registry import engine
from localmodel.engines.tuning import Serving, Spelled
from localmodel.facts.quantity import format_bytes, parse_bytes
from localmodel.rules.model import Context, CpuCondition, Rule, TuningDraft, VersionRange

GiB = 1024**3
MiB = 1024**2

# Ollama adds 768 MiB to 2 GiB of compute buffers per load for batches
# (docs/engine-facts.md#memory-budget); we budget 1 GiB, plus the Ollama server and runner
# processes themselves.
COMPUTE_OVERHEAD = 1 * GiB
RUNTIME_OVERHEAD = 256 * MiB
# promptCache: auto keeps a quarter of the KV cache's size of earlier prompts'
# states: a few recent prompts come back cached, and the budget grows by a
# quarter of the KV term, not double (docs/engine-facts.md#the-prompt-cache-in-host-memory).
PROMPT_CACHE_SHARE_OF_KV = 4

# Bytes per KV cache element (docs/engine-facts.md#kv-cache-size).
KV_BYTES_PER_ELEMENT: dict[KVCacheType, Fraction] = {
    KVCacheType.F16: Fraction(2),
    KVCacheType.Q8_0: Fraction(34, 32),
    KVCacheType.Q4_0: Fraction(18, 32),
}

AMX_FLAGS = frozenset({"AMXTILE", "AMXBF16", "AMXINT8", "AMXFP16"})


def kv_cache_bytes(
    layers: int, context: int, kv_heads: int, key_len: int, value_len: int, kv: KVCacheType
) -> int:
    """n_layer x n_ctx x n_head_kv x (key_length + value_length) x bytes/element."""
    elements = layers * context * kv_heads * (key_len + value_len)
    return -(-elements * KV_BYTES_PER_ELEMENT[kv].numerator // KV_BYTES_PER_ELEMENT[kv].denominator)


def _ceil_gib(n: int) -> int:
    return -(-n // GiB) * GiB


# --- rule functions: return the effect they had, or None -------------------


def _spell(s: TuningDraft, spelled: Spelled) -> str:
    """Write a decision as the engine spells it into the draft; its words."""
    s.args.update(spelled.args)
    s.env.update(spelled.env)
    s.modelfile.update(spelled.modelfile)
    return spelled.how


def _set_threads(ctx: Context, s: TuningDraft, n: int) -> str:
    """Set the thread count where this engine reads it; returns how, for the effect."""
    s.cpu = s.threads = n
    return _spell(s, engine(ctx.engine).threads(n))


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


def _serving(ctx: Context, s: TuningDraft) -> str | None:
    spec = ctx.spec
    serving = Serving(
        model=spec.model,
        weights_file=spec.gguf.file_name() if spec.gguf is not None else None,
        context=spec.context,
        slots=spec.slots,
        keep_alive=spec.keep_alive,
        behind_gateway=spec.gateway.enabled,
    )
    how = _spell(s, engine(ctx.engine).serving(serving))
    s.flash_attention = spec.flash_attention
    s.kv_cache = spec.kv_cache
    return how


def _kv_needs_fa(ctx: Context, s: TuningDraft) -> str | None:
    if not s.kv_cache.quantized or s.flash_attention is not FlashAttention.AUTO:
        return None
    s.flash_attention = FlashAttention.ENABLED
    how = engine(ctx.engine).flash_attention_on
    return f"flash attention auto -> enabled ({how}) for kvCache {s.kv_cache.value}"


def _spelled(spelled: Spelled | None, s: TuningDraft) -> str | None:
    return _spell(s, spelled) if spelled is not None else None


def _metrics(ctx: Context, s: TuningDraft) -> str | None:
    return _spelled(engine(ctx.engine).metrics_on(), s)


def _no_web_ui(ctx: Context, s: TuningDraft) -> str | None:
    return _spelled(engine(ctx.engine).web_ui_off(), s)


def _private_slots(ctx: Context, s: TuningDraft) -> str | None:
    if ctx.spec.gateway.enabled:
        return None
    return _spelled(engine(ctx.engine).slots_endpoint_off(), s)


def _amx_safe_path(ctx: Context, s: TuningDraft) -> str:
    changes = []
    if s.flash_attention is not FlashAttention.DISABLED:
        changes.append(f"flash attention {s.flash_attention.value} -> disabled")
        s.flash_attention = FlashAttention.DISABLED
    runner = engine(ctx.engine).safe_cpu_runner(ctx.version)
    if runner is not None:
        changes.append(_spell(s, runner))
    return ", ".join(changes)


def _amx_guard(ctx: Context, s: TuningDraft) -> str | None:
    return _amx_safe_path(ctx, s) + _features_note(ctx)


def _amx_forced(ctx: Context, s: TuningDraft) -> str | None:
    if not ctx.spec.placement.safe_cpu_path:
        return None
    effect = _amx_safe_path(ctx, s)
    return effect + f", remove {_remove_amx_library(ctx, s)} at start" + _features_note(ctx)


def _remove_amx_library(ctx: Context, s: TuningDraft) -> str:
    """Delete the engine's AMX-crashing CPU libraries at start; which, for the effect."""
    libraries = engine(ctx.engine).amx_libraries
    s.remove_libraries += [lib for lib in libraries if lib not in s.remove_libraries]
    return " ".join(libraries)


def _amx_library(ctx: Context, s: TuningDraft) -> str | None:
    return f"remove {_remove_amx_library(ctx, s)} at container start" + _features_note(ctx)


def _features_note(ctx: Context) -> str:
    notes = []
    if ctx.node.cpu_flags is None:
        notes.append("CPU features unknown on this node (no NFD or probe labels)")
    if ctx.version is None:
        notes.append("engine version unknown")
    return f" ({'; '.join(notes)}: taking the safe side)" if notes else ""


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
    return kv_cache_bytes(shape.layers, spec.context * spec.slots, shape.kv_heads,
                          shape.key_length, shape.value_length, s.kv_cache)


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
    how = _spell(s, engine(ctx.engine).prompt_cache(mib))
    return f"prompt cache {format_bytes(s.prompt_cache_bytes)} ({why}): {how}"


def _memory_auto(ctx: Context, s: TuningDraft) -> str | None:
    kv = _kv_bytes(ctx, s)
    if ctx.spec.memory != "auto" or ctx.shape is None or kv is None:
        return None
    shape, spec, cache = ctx.shape, ctx.spec, s.prompt_cache_bytes
    s.memory_parts = {
        "weights": shape.weights_bytes,
        "kvCache": kv,
        "promptCache": cache,
        "compute": COMPUTE_OVERHEAD,
        "runtime": RUNTIME_OVERHEAD,
    }
    s.memory_bytes = sum(s.memory_parts.values())
    return (
        f"memory {format_bytes(s.memory_bytes)} = weights {format_bytes(shape.weights_bytes)}"
        f" + KV cache {format_bytes(kv)} ({spec.context}x{spec.slots} tokens, {s.kv_cache.value})"
        f" + prompt cache {format_bytes(cache)}"
        f" + compute {format_bytes(COMPUTE_OVERHEAD)} + runtime {format_bytes(RUNTIME_OVERHEAD)}"
    )


def _memory_explicit(ctx: Context, s: TuningDraft) -> str | None:
    if ctx.spec.memory == "auto":
        return None
    s.memory_bytes = parse_bytes(ctx.spec.memory)
    s.memory_parts = {"spec": s.memory_bytes}
    if ctx.shape is None:
        return f"memory {ctx.spec.memory} from spec (model not in the catalog: no estimate)"
    estimate = (ctx.shape.weights_bytes + s.prompt_cache_bytes
                + COMPUTE_OVERHEAD + RUNTIME_OVERHEAD)
    if s.memory_bytes < estimate:
        s.warnings.append(
            f"memory {ctx.spec.memory} is below the weights + prompt cache + overhead estimate "
            f"{format_bytes(estimate)}: the engine may be OOM-killed"
        )
        return f"memory {ctx.spec.memory} from spec, below the estimate {format_bytes(estimate)}"
    return f"memory {ctx.spec.memory} from spec"


def _guaranteed(ctx: Context, s: TuningDraft) -> str | None:
    # The renderer always writes requests = limits; this rule records why.
    return f"requests = limits: cpu {s.cpu}, memory {format_bytes(s.memory_bytes)}"


def _volume(ctx: Context, s: TuningDraft) -> str | None:
    at = engine(ctx.engine).models_volume
    if ctx.spec.storage.size is not None:
        s.storage_bytes = parse_bytes(ctx.spec.storage.size)
        return f"volume {ctx.spec.storage.size} at {at} (from spec)"
    # Weights never exceed the memory limit (no mmap on CPU), so without a
    # known size the limit bounds them.
    weights = ctx.shape.weights_bytes if ctx.shape is not None else s.memory_bytes
    # Twice the weights: an updated tag's new blobs land before the old are pruned.
    s.storage_bytes = _ceil_gib(2 * weights + GiB)
    return f"volume {format_bytes(s.storage_bytes)} at {at} (2 x weights + 1Gi)"


AMX = CpuCondition(AMX_FLAGS, unknown=True)
# Which engines a rule is for (Rule.engines): the rules of one engine only say so.
EVERY_ENGINE = frozenset(EngineName)
OLLAMA = frozenset({EngineName.OLLAMA})
LLAMA_SERVER = frozenset({EngineName.LLAMA_SERVER})

RULES: tuple[Rule, ...] = (
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
        engines=EVERY_ENGINE,
    ),
    Rule(
        id="threads-capped-by-node",
        title="Threads never exceed the node or cpuset",
        effect="threads and CPU limit lowered to the node's allocatable CPUs, cpuset or quota",
        reason="more threads than CPUs to run them on oversubscribes the busy-wait barrier",
        source="docs/engine-facts.md#llama-server-default-thread-count; "
        "docs/engine-facts.md#oversubscription; ollama#17916",
        apply=_threads_cap,
        engines=EVERY_ENGINE,
        spec_condition="threads > allocatable CPUs, cpuset or cgroup quota",
    ),
    Rule(
        id="one-model-per-pod",
        title="One model per pod, one slot with the full context",
        effect="OLLAMA_MAX_LOADED_MODELS=1, OLLAMA_NUM_PARALLEL=slots, "
        "OLLAMA_CONTEXT_LENGTH=context, OLLAMA_KEEP_ALIVE=keepAlive, OLLAMA_MODELS under "
        f"{ollama.HOME}, engine bound to loopback behind the gateway",
        reason="defaults load up to 3 models on CPU and a 4096 context; models sharing a "
        "pod split memory, slots and cores",
        source="ollama envconfig/config.go; docs/engine-facts.md#ollama-defaults-on-cpu",
        apply=_serving,
        engines=OLLAMA,
    ),
    Rule(
        id="llama-server-context-per-slot",
        title="Explicit slots, each with the full context",
        effect="-c context x slots, -np slots; -m the GGUF on the weights volume, --alias "
        "model; engine bound to loopback behind the gateway (--host, --port)",
        reason="-c is the total context, split evenly across -np slots; without -np recent "
        "builds default to 4 slots sharing one cache",
        source="llama.cpp#16736; llama.cpp tools/server/README.md (-c, -np)",
        apply=_serving,
        engines=LLAMA_SERVER,
    ),
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
        engines=EVERY_ENGINE,
        spec_condition="kvCache q8_0/q4_0 and flashAttention auto",
    ),
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
        versions=VersionRange(high=ollama.AMX_VARIANT_BACK, unknown=True),
        cpu=AMX,
        engines=OLLAMA,
    ),
    Rule(
        id="amx-remove-cpu-variant",
        title="Remove the crashing sapphirerapids CPU variant",
        effect=f"delete {ollama.AMX_LIBRARY} at container start",
        reason="0.30.0-0.32.1 ship a sapphirerapids variant that segfaults on AMX hosts; "
        "OLLAMA_LLM_LIBRARY does not choose a CPU variant in these versions",
        source="ollama#17205; ollama#17006; ollama#17249; ollama#17236; ollama#17244; "
        "llama.cpp ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp; ollama discover/runner.go; "
        "docs/engine-facts.md#amx",
        apply=_amx_library,
        versions=VersionRange(low=ollama.AMX_VARIANT_BACK, high=ollama.AMX_FIXED_IN, unknown=True),
        cpu=AMX,
        engines=OLLAMA,
    ),
    Rule(
        id="amx-safe-path-forced",
        title="Admin-forced safe CPU path",
        effect=f"flash attention off, delete {ollama.AMX_LIBRARY}; before 0.5.12 also "
        "OLLAMA_LLM_LIBRARY=cpu_avx2",
        reason="the admin asked for the safe path on AMX nodes whatever the engine version",
        source="docs/engine-facts.md#amx; docs/engine-facts.md#ollama_llm_library; "
        "spec.placement.safeCpuPath",
        apply=_amx_forced,
        cpu=AMX,
        spec_condition="placement.safeCpuPath: true",
        engines=OLLAMA,
    ),
    Rule(
        id="kv-cache-falls-back-to-f16",
        title="KV cache falls back to f16 when flash attention is off",
        effect="kvCache -> f16, with a warning",
        reason="a quantized V cache cannot be created without flash attention: Ollama >= 0.30 "
        "fails to load the model (HTTP 500), <= 0.24 silently uses f16",
        source="docs/engine-facts.md#quantized-kv-cache; llama.cpp src/llama-context.cpp; "
        "ollama@v0.24.0 llm/server.go",
        apply=_kv_fallback,
        engines=EVERY_ENGINE,
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
        engines=EVERY_ENGINE,
    ),
    Rule(
        id="memory-from-weights-and-kv",
        title="Memory sized from weights plus KV cache",
        effect="memory = weights + KV cache (context x slots, cache type) + prompt cache "
        "+ 1Gi compute + 256Mi runtime",
        reason="CPU-only Ollama disables mmap and llama-server maps the file (its pages "
        "count against the cgroup), so weights count fully against the limit; the KV cache "
        "grows with context x slots; the prompt cache up to its bound",
        source="docs/engine-facts.md#memory-budget; docs/engine-facts.md#kv-cache-size; "
        "docs/engine-facts.md#the-prompt-cache-in-host-memory; llama.cpp src/llama-kv-cache.cpp",
        apply=_memory_auto,
        engines=EVERY_ENGINE,
        spec_condition="memory: auto",
    ),
    Rule(
        id="memory-from-spec",
        title="Explicit memory, checked against the estimate",
        effect="memory = spec.memory; a warning when it is below weights + overhead",
        reason="an explicit limit below the weights gets the engine OOM-killed at load",
        source="docs/engine-facts.md#memory-budget",
        apply=_memory_explicit,
        engines=EVERY_ENGINE,
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
        engines=EVERY_ENGINE,
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
        engines=EVERY_ENGINE,
    ),
    Rule(
        id="llama-server-metrics",
        title="Engine metrics on",
        effect="--metrics",
        reason="llama-server's Prometheus endpoint is off by default; its decode and queue "
        "counters explain a slow model",
        source="llama.cpp tools/server/README.md (--metrics)",
        apply=_metrics,
        engines=LLAMA_SERVER,
    ),
    Rule(
        id="llama-server-no-webui",
        title="No web UI",
        effect="--no-webui",
        reason="callers use the API through the gateway; the UI is code nobody in the pod needs",
        source="llama.cpp tools/server/README.md (--no-webui)",
        apply=_no_web_ui,
        engines=LLAMA_SERVER,
    ),
    Rule(
        id="llama-server-private-slots",
        title="No /slots endpoint when the engine is exposed",
        effect="--no-slots",
        reason="/slots shows every slot's prompt text; behind the gateway the engine listens "
        "on loopback only, without it the Service reaches the engine directly",
        source="llama.cpp tools/server/README.md (--slots, --no-slots)",
        apply=_private_slots,
        engines=LLAMA_SERVER,
        spec_condition="gateway.enabled: false",
    ),
)

RULES_BY_ID = {r.id: r for r in RULES}
