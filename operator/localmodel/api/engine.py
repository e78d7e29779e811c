"""The engines as the API knows them, from their facts (`localmodel.engines.FACTS`).

spec.engine.name's values and text, the default images and the example
version are built from each engine's facts module, never written per engine
here; the engine-scoped cross-field rules are built the same way in
`localmodel.api.rules`. Only the facts modules are imported: not an adapter,
not the registry (they import the renderer, which imports the API).
"""

from __future__ import annotations

from enum import StrEnum

from localmodel.engines import FACTS, llama_server, ollama


# spec.engine.name: one member per engine of `FACTS`, in its order (tests/unit/test_api.py
# checks), so code may name an engine with a type. (No docstring: the CRD would carry it.)
class EngineName(StrEnum):
    OLLAMA = ollama.NAME
    LLAMA_SERVER = llama_server.NAME


# What `engine: {}` means; the version the API's examples show is its pin.
DEFAULT = ollama
DEFAULT_ENGINE = EngineName(DEFAULT.NAME)

DEFAULT_IMAGES: dict[EngineName, str] = {EngineName(f.NAME): f.IMAGE for f in FACTS}

# spec.engine.name's and spec.engine.image's descriptions (`kubectl explain`).
NAME_DESCRIPTION = (
    "Inference engine: " + " or ".join(f"`{f.NAME}` ({f.SUMMARY})" for f in FACTS) + "."
)
IMAGE_DESCRIPTION = (
    "Engine container image. Defaults to a pinned image per engine ("
    + "; ".join(f"{f.NAME}: {f.IMAGE}" for f in FACTS)
    + ")."
)

