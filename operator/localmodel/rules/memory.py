"""The memory a replica needs, term by term: pure arithmetic on the model's shape
and the pod's settings, which the memory rule (rules/table.py) and the sizes
benchmark (benchmarks/sizes.py) both call through `memory_decision`.

Each term follows how llama.cpp allocates, as llama-server (and Ollama's
llama-server child, which gets the same `-c`, `-np`, cache types and `-fa`)
reports it at load with `-lv 4`, checked against that accounting at 72 points
(tests/rules/test_memory.py):

- weights: the GGUF's bytes, whichever way the engine holds them
  (docs/engine-facts.md#weights-in-memory);
- KV cache: the layers that attend to the whole context at context x slots
  cells, a sliding-window layer at the window + one micro-batch per slot
  (docs/engine-facts.md#sliding-window-kv-cache);
- compute: the graph allocator's high-water mark for one micro-batch over the
  per-slot context, far larger without flash attention, and the CPU backend's
  work buffer beside it (docs/engine-facts.md#compute-buffer);
- prompt cache: the bound the engine is told; context checkpoints: for a
  sliding-window model, the copies of each slot's sliding-window cache the engine
  keeps while it reads a prompt, at most the count it is told
  (docs/engine-facts.md#context-checkpoints); runtime: the process around the
  buffers (docs/engine-facts.md#runtime).

A field the shape does not know (a `spec.modelInfo` that leaves it out) is
replaced by a stated conservative bound, named in `MemoryBudget.assumed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from localmodel.api import KVCacheType
from localmodel.catalog import ModelShape
from localmodel.rules.model import UBATCH

MiB = 1024**2

# llama.cpp pads the context, and a sliding-window cache, to whole 256-cell blocks
# (docs/engine-facts.md#sliding-window-kv-cache).
CELL_PAD = 256
# The process around its buffers: at most 54 MiB of llama-server's anonymous
# memory after load is none of them, the per-thread work buffer comes at the first
# evaluation, and Ollama adds its own server process, about 30 MiB
# (docs/engine-facts.md#runtime). One figure for every engine: Ollama's model
# runs in the same llama-server, so no other term differs by engine.
RUNTIME = 128 * MiB

# Context checkpoints kept per slot (llama-server --ctx-checkpoints, Ollama's child
# LLAMA_ARG_CTX_CHECKPOINTS; llama.cpp's default is 32): the two a prompt makes near
# its end (4 + n_ubatch and 4 tokens before it; llama.cpp
# tools/server/server-context.cpp), the ones the next turn of a chat restores; each
# a copy of the slot's sliding-window cache (docs/engine-facts.md#context-checkpoints).
CONTEXT_CHECKPOINTS = 2

# Bytes per KV cache element (docs/engine-facts.md#kv-cache-size).
KV_BYTES_PER_ELEMENT: dict[KVCacheType, Fraction] = {
    KVCacheType.F16: Fraction(2),
    KVCacheType.Q8_0: Fraction(34, 32),
    KVCacheType.Q4_0: Fraction(18, 32),
}

# The conservative bounds for what a shape may not say (each named in the decision).
GROUPING_BOUND = 8  # query heads per KV head: the catalog's largest (Llama 3.x 70B, Qwen3 32B)
VOCAB_BOUND = 262144  # the catalog's largest vocabulary (Gemma 3)
EMBEDDING_PER_QUERY_WIDTH = 2  # hidden size <= 2 x heads x head size (catalog: <= 1.32)
FEED_FORWARD_PER_EMBEDDING = 8  # feed-forward width <= 8 x hidden size (catalog: <= 6.4)


@dataclass(frozen=True)
class MemoryBudget:
    """A replica's memory, by part (bytes), and the bounds assumed for what the
    model's shape did not say."""

    weights: int
    kv_cache: int
    prompt_cache: int
    compute: int
    runtime: int
    checkpoints: int = 0
    assumed: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.prompt_cache + self.checkpoints
                + self.compute + self.runtime)

    def parts(self) -> dict[str, int]:
        """The parts by the names the status and the decision text use."""
        return {"weights": self.weights, "kvCache": self.kv_cache,
                "promptCache": self.prompt_cache, "contextCheckpoints": self.checkpoints,
                "compute": self.compute, "runtime": self.runtime}


@dataclass(frozen=True)
class Dimensions:
    """The numbers the compute term reads, each known or bounded."""

    heads: int
    embedding: int
    feed_forward: int
    vocab: int
    assumed: tuple[str, ...]


def _pad(n: int) -> int:
    return -(-n // CELL_PAD) * CELL_PAD


def kv_cache_bytes(
    layers: int, context: int, kv_heads: int, key_len: int, value_len: int, kv: KVCacheType
) -> int:
    """n_layer x cells x n_head_kv x (key_length + value_length) x bytes/element."""
    elements = layers * context * kv_heads * (key_len + value_len)
    per = KV_BYTES_PER_ELEMENT[kv]
    return -(-elements * per.numerator // per.denominator)


def micro_batch(context: int, slots: int, ubatch: int = UBATCH) -> int:
    """The tokens of one graph evaluation: -ub, never more than the context
    (llama.cpp src/llama-context.cpp: n_ubatch = min(n_batch, n_ubatch),
    n_batch = min(n_ctx, n_batch))."""
    return min(ubatch, _pad(context * slots))


def kv_cells(shape: ModelShape, context: int, slots: int, ubatch: int = UBATCH
             ) -> tuple[int, int]:
    """Per slot: the cells of a whole-context layer and of a sliding-window layer
    (0 without a window)."""
    per_slot = _pad(_pad(context * slots) // slots)
    if not shape.sliding_window:
        return per_slot, 0
    window = _pad(shape.sliding_window + micro_batch(context, slots, ubatch))
    return per_slot, min(per_slot, window)


def _global_layers(shape: ModelShape) -> int:
    if not shape.sliding_window or shape.global_layers is None:
        return shape.layers
    return min(shape.global_layers, shape.layers)


def model_kv_bytes(shape: ModelShape, context: int, slots: int, kv: KVCacheType,
                   ubatch: int = UBATCH) -> int:
    """The KV cache llama.cpp allocates for context x slots: the whole-context
    layers at every cell, the sliding-window layers at their window per slot."""
    cells, window = kv_cells(shape, context, slots, ubatch)
    full = _global_layers(shape)

    def layers_at(layers: int, per_slot: int) -> int:
        return kv_cache_bytes(layers, per_slot * slots, shape.kv_heads,
                              shape.key_length, shape.value_length, kv)

    return layers_at(full, cells) + layers_at(shape.layers - full, window)


def checkpoint_bytes(shape: ModelShape, context: int, slots: int, kv: KVCacheType,
                     ubatch: int = UBATCH, checkpoints: int = CONTEXT_CHECKPOINTS) -> int:
    """The context checkpoints of every slot, `checkpoints` per slot: each the state
    `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` writes, the sliding-window layers' cells the
    window does not mask (at most the window's), with each cell's position and
    sequence count (16 B at most) and each layer's types and row sizes (32 B); a
    model without a sliding window makes none (llama.cpp
    tools/server/server-context.cpp `create_checkpoint`, src/llama-kv-cache-iswa.cpp
    and src/llama-kv-cache.cpp `state_write`)."""
    per_slot, window = kv_cells(shape, context, slots, ubatch)
    if not window:
        return 0
    cells = min(per_slot, shape.sliding_window)
    swa_layers = shape.layers - _global_layers(shape)
    one = kv_cache_bytes(swa_layers, cells, shape.kv_heads, shape.key_length,
                         shape.value_length, kv) + 16 * cells + 32 * swa_layers
    return checkpoints * slots * one


def dimensions(shape: ModelShape) -> Dimensions:
    """The compute term's numbers: the shape's, or a stated bound for each unknown."""
    assumed: list[str] = []
    heads = shape.heads
    if heads is None:
        heads = GROUPING_BOUND * shape.kv_heads
        assumed.append(f"heads unknown: {GROUPING_BOUND} x kvHeads = {heads}")
    embedding = shape.embedding
    if embedding is None:
        embedding = EMBEDDING_PER_QUERY_WIDTH * heads * shape.key_length
        assumed.append(f"embeddingLength unknown: {EMBEDDING_PER_QUERY_WIDTH} x heads x "
                       f"keyLength = {embedding}")
    feed_forward = shape.feed_forward
    if feed_forward is None:
        feed_forward = FEED_FORWARD_PER_EMBEDDING * embedding
        assumed.append(f"feedForwardLength unknown: {FEED_FORWARD_PER_EMBEDDING} x "
                       f"embeddingLength = {feed_forward}")
    vocab = shape.vocab
    if vocab is None:
        vocab = VOCAB_BOUND
        assumed.append(f"vocabSize unknown: {vocab}")
    return Dimensions(heads, embedding, feed_forward, vocab, tuple(assumed))


def compute_bytes(shape: ModelShape, context: int, slots: int, kv: KVCacheType,
                  flash_attention: bool, ubatch: int = UBATCH) -> tuple[int, tuple[str, ...]]:
    """llama-server's compute buffer for one micro-batch of n_t tokens over the
    per-slot context n_kv (docs/engine-facts.md#compute-buffer), f32 (4 B) unless
    said: the attention masks (f16 with flash attention, f32 without: n_t x the
    cells of each cache kind) stay live through the graph; beside them the larger
    of the attention step (without flash attention the scores, n_head x n_kv x n_t,
    beside 7 x n_embd + 2 x n_head_kv x head size per token) and the feed-forward
    step (3 x n_ff + 4 x n_embd per token; without flash attention a sliding-window
    model's also holds n_head x window); with flash attention and a quantized
    cache, one more query-sized tensor; and the logits of one token per slot.
    Returns the bytes and the bounds assumed."""
    d = dimensions(shape)
    n_t = micro_batch(context, slots, ubatch)
    n_kv, n_swa = kv_cells(shape, context, slots, ubatch)
    per_token = 4 * n_t
    masks = (2 if flash_attention else 4) * n_t * (n_kv + n_swa)
    ffn = per_token * (3 * d.feed_forward + 4 * d.embedding)
    query = d.heads * shape.key_length
    if flash_attention:
        core = ffn + (per_token * (query + shape.key_length) if kv is not KVCacheType.F16
                      else 0)
    else:
        scores = per_token * (d.heads * n_kv + 7 * d.embedding
                              + 2 * shape.kv_heads * shape.key_length)
        core = max(scores, ffn + per_token * d.heads * shape.sliding_window)
    logits = 4 * d.vocab * slots
    return masks + core + logits, d.assumed


def work_buffer_bytes(shape: ModelShape, context: int, slots: int, flash_attention: bool,
                      ubatch: int = UBATCH) -> int:
    """The CPU backend's work buffer, outside the compute buffer: the largest input a
    matrix product converts to its weights' dot type (ggml-cpu `ggml_graph_plan`).
    Without flash attention that is the scores, converted to f16 for the product
    with the f16 V cache: n_head x n_kv x n_t x 2 B (128 MiB for Gemma 3 270M at
    32k); otherwise the feed-forward input, n_ff x n_t at most 2 B each
    (docs/engine-facts.md#compute-buffer)."""
    d = dimensions(shape)
    n_t = micro_batch(context, slots, ubatch)
    n_kv, _ = kv_cells(shape, context, slots, ubatch)
    ffn = 2 * d.feed_forward * n_t
    return ffn if flash_attention else max(ffn, 2 * d.heads * n_kv * n_t)


def memory_decision(
    shape: ModelShape,
    *,
    context: int,
    slots: int,
    kv_cache: KVCacheType,
    flash_attention: bool,
    prompt_cache_bytes: int,
    ubatch: int = UBATCH,
) -> MemoryBudget:
    """The memory one replica of `shape` needs (on llama-server, or Ollama's
    llama-server child) with `context` tokens per slot, `slots` slots, this KV cache type,
    flash attention on or off (as the engine resolves it: `auto` is on, on CPU)
    and a prompt cache bounded at `prompt_cache_bytes`."""
    buffer, assumed = compute_bytes(shape, context, slots, kv_cache, flash_attention, ubatch)
    compute = buffer + work_buffer_bytes(shape, context, slots, flash_attention, ubatch)
    return MemoryBudget(
        weights=shape.weights_bytes,
        kv_cache=model_kv_bytes(shape, context, slots, kv_cache, ubatch),
        prompt_cache=prompt_cache_bytes,
        checkpoints=checkpoint_bytes(shape, context, slots, kv_cache, ubatch),
        compute=-(-compute // MiB) * MiB,
        runtime=RUNTIME,
        assumed=assumed,
    )
