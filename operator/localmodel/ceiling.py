"""The decode rate a node's memory cannot pass: its bandwidth over the bytes read per token. Pure.

On a CPU, generating one token reads every weight the forward pass multiplies by once, and
the KV cache of every token before it; memory bandwidth, not arithmetic, bounds the rate at
the sizes people run (docs/engine-facts.md#decode-is-bound-by-memory-bandwidth). So:

    ceiling (tok/s) = bandwidth at the replica's threads / (weights read + KV read) per token

* **Bandwidth at t threads** (`bandwidth_at`): the node probe measures one thread's and all
  its threads' (probe/stream.py, published as node labels, read by facts/node.py). A
  replica's t threads read at most t times one thread's rate and at most what all threads
  read together: ``min(t x one, all)``. Where only one thread's is known (the probe's memory
  limit did not hold arrays past every last-level cache together), t threads get one
  thread's rate: a lower bound, so a ceiling too low, never one too high that would call a
  healthy replica slow.
* **Weights read per token** (`weights_read_per_token`): every weight tensor but the token
  embeddings, of which one row per token is read (llama.cpp ``ggml_get_rows`` on
  ``token_embd.weight``); a model whose output layer is the embeddings (no
  ``output.weight``: tied, as Gemma 3's) reads them whole for the logits. The operator
  knows a model's weights only as its file's size (the catalog or ``spec.modelInfo``), so
  `replica_ceiling` counts the whole file: an untied model's embeddings are then counted
  whole (Qwen3 8B: 0.35 of 5.2 GB), a ceiling a few percent low, never high.
* **KV read per token** at a context of c tokens: c tokens' keys and values in every layer
  (`rules.memory.kv_cache_bytes`; a sliding-window layer's window at most). The operator
  predicts at a slot's full
  context (`spec.context`): the slowest ceiling any one request meets, so a replica serving
  long prompts is never called slow against the ceiling of a short one.

`predicted_decode` is the one formula; the benchmark (benchmarks/sizes.py) calls it with the
bytes of a real file and the context it decodes at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from localmodel.api import KVCacheType
from localmodel.catalog import ModelShape
from localmodel.facts.model import MemoryBandwidth, NodeFacts
from localmodel.rules.memory import kv_cache_bytes
from localmodel.speed import Ceiling

__all__ = [
    "TOKEN_EMBEDDINGS",
    "Prediction",
    "bandwidth_at",
    "kv_read_bytes",
    "predicted_decode",
    "replica_ceiling",
    "weights_read_per_token",
]

TOKEN_EMBEDDINGS = "token_embd.weight"  # GGUF's tensor names (llama.cpp src/llama-arch.cpp)
OUTPUT = "output.weight"


@dataclass(frozen=True)
class Prediction:
    """Decides a decode ceiling: bandwidth, bytes per token, and the tokens per second of both."""

    tokens_per_second: float
    bandwidth: float  # bytes per second at the replica's threads
    bytes_per_token: int  # weights read + KV read at `context`
    context: int = 0  # tokens of KV read per token

    @property
    def describe(self) -> str:
        """``predicted: 4.6 GB/s / 4.5 GB per token`` (and the context, when counted)."""
        at = f" at {self.context} tokens of context" if self.context else ""
        return (f"predicted: {self.bandwidth / 1e9:.3g} GB/s / "
                f"{self.bytes_per_token / 1e9:.3g} GB per token{at}")

    @property
    def ceiling(self) -> Ceiling:
        """What the speed verdicts read of it (`localmodel.speed.Ceiling`)."""
        return Ceiling(self.tokens_per_second, self.describe)


def predicted_decode(bandwidth_bytes_per_second: float, weights_read_bytes: int,
                     kv_read_bytes: int = 0, context: int = 0) -> Prediction:
    """The decode ceiling: bandwidth / (weights read + KV read) per token. ``context`` only
    labels the KV term (the tokens it is of)."""
    total = weights_read_bytes + kv_read_bytes
    if not bandwidth_bytes_per_second > 0 or total <= 0 or kv_read_bytes < 0:
        raise ValueError("a ceiling needs a positive bandwidth and bytes per token")
    return Prediction(bandwidth_bytes_per_second / total, bandwidth_bytes_per_second, total,
                      context)


def bandwidth_at(bandwidth: MemoryBandwidth, threads: int) -> float:
    """Bytes per second ``threads`` threads read: min(threads x one thread's, all threads');
    one thread's when all threads' is not known (a lower bound)."""
    if bandwidth.all_threads is None:
        return float(bandwidth.one_thread)
    linear = bandwidth.one_thread * max(1, threads)
    return float(min(linear, max(bandwidth.all_threads, bandwidth.one_thread)))


def weights_read_per_token(tensor_bytes: Mapping[str, int], vocabulary: int) -> int:
    """Bytes of weights one token reads, from a GGUF's tensors (name -> bytes) and its vocabulary
    size: all tensors, but one row of the token embeddings unless they are the output too."""
    total = sum(tensor_bytes.values())
    embeddings = tensor_bytes.get(TOKEN_EMBEDDINGS, 0)
    if OUTPUT not in tensor_bytes or vocabulary <= 0:
        return total  # tied: the logits read every row
    return total - embeddings + -(-embeddings // vocabulary)


def kv_read_bytes(shape: ModelShape, context: int, kv_cache: KVCacheType) -> int:
    """Bytes of keys and values one token reads at ``context`` tokens before it: a
    sliding-window layer's at most its window's."""
    full = shape.layers
    if shape.sliding_window and shape.global_layers is not None:
        full = min(shape.global_layers, shape.layers)
    window = min(context, shape.sliding_window or context)

    def read(layers: int, tokens: int) -> int:
        return kv_cache_bytes(layers, tokens, shape.kv_heads, shape.key_length,
                              shape.value_length, kv_cache)

    return read(full, context) + read(shape.layers - full, window)


def replica_ceiling(shape: ModelShape | None, node: NodeFacts | None, threads: int,
                    context: int, kv_cache: KVCacheType) -> Prediction | None:
    """A replica's ceiling at its node's bandwidth, its threads and a slot's full context; None
    when the node's bandwidth or the model's shape is not known."""
    if shape is None or node is None or node.memory_bandwidth is None:
        return None
    if shape.weights_bytes <= 0 or threads < 1:
        return None
    return predicted_decode(bandwidth_at(node.memory_bandwidth, threads), shape.weights_bytes,
                            kv_read_bytes(shape, max(0, context), kv_cache), max(0, context))
