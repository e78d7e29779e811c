"""Built-in catalog: weights size and architecture of common Ollama tags.

Architecture numbers come from each model's published `config.json` (cited per
family below): `num_hidden_layers`, `num_key_value_heads`, `head_dim`,
`num_attention_heads`, `hidden_size`, `intermediate_size`, `vocab_size`, and for
Gemma 3 `sliding_window` with one layer in six attending to the whole context
(`sliding_window_pattern` 6). GGUF carries them as `<arch>.block_count`,
`<arch>.attention.head_count(_kv)`, `<arch>.attention.key_length` /
`value_length`, `<arch>.embedding_length`, `<arch>.feed_forward_length`,
`<arch>.attention.sliding_window` (docs/engine-facts.md, Memory); the memory
decision (rules/memory.py) reads them. Weights sizes are the download sizes of
Ollama's default (Q4_K_M) tags as the Ollama library lists them: both engines
hold about the file's bytes (docs/engine-facts.md#weights-in-memory). For
anything else, `spec.modelInfo` says it.
"""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.api import ModelInfo
from localmodel.facts.quantity import parse_bytes

GB = 1000**3
MB = 1000**2


@dataclass(frozen=True)
class ModelShape:
    """One model's weights size and architecture: what its memory decision reads.
    A field left None is unknown (a `spec.modelInfo` that does not say it): the
    decision then uses a stated conservative bound (rules/memory.py)."""

    family: str
    weights_bytes: int
    layers: int
    kv_heads: int
    key_length: int
    value_length: int
    source: str = "catalog"
    heads: int | None = None
    embedding: int | None = None
    feed_forward: int | None = None
    vocab: int | None = None
    sliding_window: int = 0  # 0: every layer attends to the whole context
    global_layers: int | None = None  # with a window: the layers that do not use it


@dataclass(frozen=True)
class _Arch:
    """A published config's numbers, shared by the tags of one size."""

    layers: int
    heads: int
    kv_heads: int
    head: int
    embedding: int
    feed_forward: int
    vocab: int
    window: int = 0


def _s(family: str, weights: float, a: _Arch) -> ModelShape:
    # Gemma 3: layers 6, 12, ... attend to the whole context, the rest to the window
    # (sliding_window_pattern 6; llama.cpp src/llama-model.cpp set_swa_pattern(6)).
    global_layers = a.layers // 6 if a.window else None
    return ModelShape(family, int(weights), a.layers, a.kv_heads, a.head, a.head,
                      heads=a.heads, embedding=a.embedding, feed_forward=a.feed_forward,
                      vocab=a.vocab, sliding_window=a.window, global_layers=global_layers)


QWEN3_VOCAB, LLAMA3_VOCAB, GEMMA3_VOCAB = 151936, 128256, 262144

CATALOG: dict[str, ModelShape] = {
    # Qwen3 (huggingface.co/Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B,30B-A3B} config.json:
    # head_dim 128; the 30B-A3B MoE: 8 of 128 experts of 768 per token)
    "qwen3:0.6b": _s("qwen3", 523 * MB, _Arch(28, 16, 8, 128, 1024, 3072, QWEN3_VOCAB)),
    "qwen3:1.7b": _s("qwen3", 1.4 * GB, _Arch(28, 16, 8, 128, 2048, 6144, QWEN3_VOCAB)),
    "qwen3:4b": _s("qwen3", 2.5 * GB, _Arch(36, 32, 8, 128, 2560, 9728, QWEN3_VOCAB)),
    "qwen3:8b": _s("qwen3", 5.2 * GB, _Arch(36, 32, 8, 128, 4096, 12288, QWEN3_VOCAB)),
    "qwen3:14b": _s("qwen3", 9.3 * GB, _Arch(40, 40, 8, 128, 5120, 17408, QWEN3_VOCAB)),
    "qwen3:30b": _s("qwen3moe", 19 * GB, _Arch(48, 32, 4, 128, 2048, 8 * 768, QWEN3_VOCAB)),
    "qwen3:32b": _s("qwen3", 20 * GB, _Arch(64, 64, 8, 128, 5120, 25600, QWEN3_VOCAB)),
    # Llama 3.x (huggingface.co/meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B, -70B,
    # Llama-3.3-70B-Instruct config.json; 3.2-1B has head_dim 64)
    "llama3.2:1b": _s("llama", 1.3 * GB, _Arch(16, 32, 8, 64, 2048, 8192, LLAMA3_VOCAB)),
    "llama3.2:3b": _s("llama", 2.0 * GB, _Arch(28, 24, 8, 128, 3072, 8192, LLAMA3_VOCAB)),
    "llama3.1:8b": _s("llama", 4.9 * GB, _Arch(32, 32, 8, 128, 4096, 14336, LLAMA3_VOCAB)),
    "llama3.1:70b": _s("llama", 43 * GB, _Arch(80, 64, 8, 128, 8192, 28672, LLAMA3_VOCAB)),
    "llama3.3:70b": _s("llama", 43 * GB, _Arch(80, 64, 8, 128, 8192, 28672, LLAMA3_VOCAB)),
    # Gemma 3 (huggingface.co/google/gemma-3-{270m,1b-it} config.json, gemma-3-{4b,12b,27b}-it
    # text_config; the 4B, 12B and 27B tags also carry the vision tower in Ollama's size)
    "gemma3:270m": _s("gemma3", 292 * MB, _Arch(18, 4, 1, 256, 640, 2048, GEMMA3_VOCAB, 512)),
    "gemma3:1b": _s("gemma3", 815 * MB, _Arch(26, 4, 1, 256, 1152, 6912, GEMMA3_VOCAB, 512)),
    "gemma3:4b": _s("gemma3", 3.3 * GB, _Arch(34, 8, 4, 256, 2560, 10240, GEMMA3_VOCAB, 1024)),
    "gemma3:12b": _s("gemma3", 8.1 * GB,
                     _Arch(48, 16, 8, 256, 3840, 15360, GEMMA3_VOCAB, 1024)),
    "gemma3:27b": _s("gemma3", 17 * GB,
                     _Arch(62, 32, 16, 128, 5376, 21504, GEMMA3_VOCAB, 1024)),
    # Phi (huggingface.co/microsoft/Phi-3-mini-4k-instruct, Phi-3-medium-4k-instruct, phi-4,
    # Phi-4-mini-instruct config.json: phi-3-mini has no GQA, 32 KV heads of 96)
    "phi3:3.8b": _s("phi3", 2.2 * GB, _Arch(32, 32, 32, 96, 3072, 8192, 32064)),
    "phi3:14b": _s("phi3", 7.9 * GB, _Arch(40, 40, 10, 128, 5120, 17920, 32064)),
    "phi4:14b": _s("phi3", 9.1 * GB, _Arch(40, 40, 10, 128, 5120, 17920, 100352)),
    "phi4-mini:3.8b": _s("phi3", 2.5 * GB, _Arch(32, 24, 8, 128, 3072, 8192, 200064)),
    # Mistral (huggingface.co/mistralai/Mistral-7B-Instruct-v0.3, Mistral-Nemo-Instruct-2407,
    # Mistral-Small-24B-Instruct-2501 config.json)
    "mistral:7b": _s("llama", 4.1 * GB, _Arch(32, 32, 8, 128, 4096, 14336, 32768)),
    "mistral-nemo:12b": _s("llama", 7.1 * GB, _Arch(40, 32, 8, 128, 5120, 14336, 131072)),
    "mistral-small:24b": _s("llama", 14 * GB, _Arch(40, 32, 8, 128, 5120, 32768, 131072)),
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
            heads=info.heads,
            embedding=info.embedding_length,
            feed_forward=info.feed_forward_length,
            vocab=info.vocab_size,
            sliding_window=info.sliding_window or 0,
            global_layers=info.global_layers,
        )
    return CATALOG.get(normalize(model))


def _family_guess(model: str) -> str:
    name = normalize(model).split("/")[-1].split(":")[0]
    return name.rstrip("0123456789.") or name
