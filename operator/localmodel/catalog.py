"""Built-in catalog: weights size and KV-cache shape of common Ollama tags.

Architecture numbers (blocks, KV heads, head sizes) come from each model's
published config (`num_hidden_layers`, `num_key_value_heads`, `head_dim`),
which GGUF carries as `<arch>.block_count`, `<arch>.attention.head_count_kv`,
`<arch>.attention.key_length` / `value_length` (docs/engine-facts.md, Memory).
Weights sizes are the download sizes of Ollama's default (Q4_K_M) tags as the
Ollama library lists them; CPU-only Ollama disables mmap, so they count fully
against the memory limit. For anything else, `spec.modelInfo` says it.
"""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.api import ModelInfo
from localmodel.facts.quantity import parse_bytes

GB = 1000**3
MB = 1000**2


@dataclass(frozen=True)
class ModelShape:
    """One model's weights size and KV-cache shape: what its memory estimate reads."""

    family: str
    weights_bytes: int
    layers: int
    kv_heads: int
    key_length: int
    value_length: int
    source: str = "catalog"


def _s(family: str, weights: float, layers: int, kv_heads: int, head: int) -> ModelShape:
    return ModelShape(family, int(weights), layers, kv_heads, head, head)


CATALOG: dict[str, ModelShape] = {
    # Qwen3 (Qwen/Qwen3-*: head_dim 128, 8 KV heads; 30B-A3B MoE has 4)
    "qwen3:0.6b": _s("qwen3", 523 * MB, 28, 8, 128),
    "qwen3:1.7b": _s("qwen3", 1.4 * GB, 28, 8, 128),
    "qwen3:4b": _s("qwen3", 2.5 * GB, 36, 8, 128),
    "qwen3:8b": _s("qwen3", 5.2 * GB, 36, 8, 128),
    "qwen3:14b": _s("qwen3", 9.3 * GB, 40, 8, 128),
    "qwen3:30b": _s("qwen3moe", 19 * GB, 48, 4, 128),
    "qwen3:32b": _s("qwen3", 20 * GB, 64, 8, 128),
    # Llama 3.x (meta-llama: 8 KV heads; 3.2-1B has head_dim 64)
    "llama3.2:1b": _s("llama", 1.3 * GB, 16, 8, 64),
    "llama3.2:3b": _s("llama", 2.0 * GB, 28, 8, 128),
    "llama3.1:8b": _s("llama", 4.9 * GB, 32, 8, 128),
    "llama3.1:70b": _s("llama", 43 * GB, 80, 8, 128),
    "llama3.3:70b": _s("llama", 43 * GB, 80, 8, 128),
    # Gemma 3 (google/gemma-3-*; sliding-window layers are counted in full: an overestimate)
    "gemma3:270m": _s("gemma3", 292 * MB, 18, 1, 256),
    "gemma3:1b": _s("gemma3", 815 * MB, 26, 1, 256),
    "gemma3:4b": _s("gemma3", 3.3 * GB, 34, 4, 256),
    "gemma3:12b": _s("gemma3", 8.1 * GB, 48, 8, 256),
    "gemma3:27b": _s("gemma3", 17 * GB, 62, 16, 128),
    # Phi (microsoft: phi-3-mini has no GQA, 32 KV heads of 96)
    "phi3:3.8b": _s("phi3", 2.2 * GB, 32, 32, 96),
    "phi3:14b": _s("phi3", 7.9 * GB, 40, 10, 128),
    "phi4:14b": _s("phi3", 9.1 * GB, 40, 10, 128),
    "phi4-mini:3.8b": _s("phi3", 2.5 * GB, 32, 8, 128),
    # Mistral
    "mistral:7b": _s("llama", 4.1 * GB, 32, 8, 128),
    "mistral-nemo:12b": _s("llama", 7.1 * GB, 40, 8, 128),
    "mistral-small:24b": _s("llama", 14 * GB, 40, 8, 128),
}

# Ollama's default tags for a bare name or `:latest`.
ALIASES: dict[str, str] = {
    "qwen3": "qwen3:8b",
    "llama3.2": "llama3.2:3b",
    "llama3.1": "llama3.1:8b",
    "llama3.3": "llama3.3:70b",
    "gemma3": "gemma3:4b",
    "phi3": "phi3:3.8b",
    "phi3:mini": "phi3:3.8b",
    "phi3:medium": "phi3:14b",
    "phi4": "phi4:14b",
    "phi4-mini": "phi4-mini:3.8b",
    "mistral": "mistral:7b",
    "mistral-nemo": "mistral-nemo:12b",
    "mistral-small": "mistral-small:24b",
}


def normalize(model: str) -> str:
    """`library/qwen3:latest` and `registry.ollama.ai/library/qwen3` -> `qwen3:8b`."""
    ref = model.strip().lower()
    for prefix in ("registry.ollama.ai/", "library/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    if ref.endswith(":latest"):
        ref = ref[: -len(":latest")]
    return ALIASES.get(ref, ref)


def lookup(model: str, info: ModelInfo | None = None) -> ModelShape | None:
    """The model's shape: from `spec.modelInfo` when given, else the catalog."""
    if info is not None:
        return ModelShape(
            family=info.family or _family_guess(model),
            weights_bytes=parse_bytes(info.weights_size),
            layers=info.layers,
            kv_heads=info.kv_heads,
            key_length=info.key_length,
            value_length=info.value_length,
            source="spec.modelInfo",
        )
    return CATALOG.get(normalize(model))


def _family_guess(model: str) -> str:
    name = normalize(model).split("/")[-1].split(":")[0]
    return name.rstrip("0123456789.") or name
