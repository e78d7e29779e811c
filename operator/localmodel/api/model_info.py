"""`spec.modelInfo`: the size and shape of a model the built-in catalog does not
know, as the memory decision reads them (catalog.py, rules/memory.py)."""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from localmodel.api.checks import ApiModel, Integer, QuantityRange

WEIGHTS_SIZE = QuantityRange("1Mi", "64Ti", example="4.7Gi")
FAMILY_PATTERN = r"^[a-z0-9][a-z0-9.\-]*$"


# An optional bounded integer: the bounds before the type check, so the schema says
# minimum/maximum (the CRD's) inside its `anyOf [integer, null]`.
_INTEGER = get_args(Integer)[1]


class ModelInfo(ApiModel):
    """Size and shape of a model the built-in catalog does not know."""

    weights_size: Annotated[str, WEIGHTS_SIZE] = Field(
        description="Size of the model weights as stored by the engine (a quantity, "
        "e.g. `4.7Gi`): the GGUF file's size. Both engines keep about all of it in "
        "memory (repacked or mapped), so all of it counts against the memory limit.",
    )
    layers: Integer = Field(
        description="Transformer blocks (GGUF `<arch>.block_count`).", ge=1, le=4096
    )
    kv_heads: Integer = Field(
        description="Key/value attention heads (GGUF `<arch>.attention.head_count_kv`).",
        ge=1,
        le=4096,
    )
    key_length: Integer = Field(
        128, description="Key head size (GGUF `<arch>.attention.key_length`).", ge=1, le=65536
    )
    value_length: Integer = Field(
        128,
        description="Value head size (GGUF `<arch>.attention.value_length`).",
        ge=1,
        le=65536,
    )
    family: str | None = Field(
        None,
        description="Model family (e.g. `qwen3`, `llama`, `gemma3`) for family-scoped rules.",
        pattern=FAMILY_PATTERN,
    )
    # What the compute-buffer and sliding-window terms of the memory decision read
    # (rules/memory.py); each left out is replaced by a stated conservative bound.
    heads: Annotated[int, Field(ge=1, le=4096), _INTEGER] | None = Field(
        None, description="Query attention heads (GGUF `<arch>.attention.head_count`)."
    )
    embedding_length: Annotated[int, Field(ge=1, le=1048576), _INTEGER] | None = Field(
        None, description="Hidden size (GGUF `<arch>.embedding_length`)."
    )
    feed_forward_length: Annotated[int, Field(ge=1, le=4194304), _INTEGER] | None = Field(
        None,
        description="Feed-forward width (GGUF `<arch>.feed_forward_length`; for a mixture "
        "of experts, the expert width x the experts used per token).",
    )
    vocab_size: Annotated[int, Field(ge=1, le=16777216), _INTEGER] | None = Field(
        None, description="Tokens in the vocabulary (the GGUF's `tokenizer.ggml.tokens`)."
    )
    sliding_window: Annotated[int, Field(ge=1, le=16777216), _INTEGER] | None = Field(
        None,
        description="Tokens a sliding-window layer attends to (GGUF "
        "`<arch>.attention.sliding_window`); unset: every layer attends to the whole context.",
    )
    global_layers: Annotated[int, Field(ge=0, le=4096), _INTEGER] | None = Field(
        None,
        description="With `slidingWindow`: how many layers attend to the whole context "
        "(Gemma 3: one in six); the others keep only the window.",
    )
