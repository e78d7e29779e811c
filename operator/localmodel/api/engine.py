"""The engines as the API knows them, from their facts (`localmodel.engines`).

spec.engine.name's values are every registered engine's (`engines.FACTS`:
shipped, then out-of-tree ones named by `LOCALMODEL_ENGINE_PACKAGES`, so a
test-only engine's LocalModel validates and renders); the texts `kubectl
explain` shows describe the shipped engines (`engines.SHIPPED`), and the CRD
lists only those (localmodel.crd). The default images and the default engine
come from the facts too, never written per engine here; the engine-scoped
cross-field rules are built the same way in `localmodel.api.rules`. Only the
facts modules are imported: not an adapter, not the registry (they import the
API).
"""

from __future__ import annotations

from enum import StrEnum

from localmodel.engines import DEFAULT, FACTS, SHIPPED


def _member(name: str) -> str:
    """An engine's enum member name: `llama-server` -> LLAMA_SERVER."""
    return name.upper().replace("-", "_").replace(".", "_")


# spec.engine.name: one member per engine of `FACTS`, in its order (tests/unit/test_api.py
# checks), so code may name an engine with a type. (No docstring: the CRD would carry it.)
EngineName = StrEnum(  # type: ignore[misc]  # members from the registry, not literals
    "EngineName", [(_member(f.NAME), f.NAME) for f in FACTS], module=__name__)

# What `engine: {}` means (the default engine is decided in localmodel.engines);
# the version the API's examples show is its pin (its image's tag).
DEFAULT_ENGINE = EngineName(DEFAULT.NAME)
EXAMPLE_VERSION = DEFAULT.IMAGE.rsplit(":", 1)[-1]

DEFAULT_IMAGES: dict[EngineName, str] = {EngineName(f.NAME): f.IMAGE for f in FACTS}

# spec.engine.name's and spec.engine.image's descriptions (`kubectl explain`).
NAME_DESCRIPTION = (
    "Inference engine: " + " or ".join(f"`{f.NAME}` ({f.SUMMARY})" for f in SHIPPED) + "."
)
IMAGE_DESCRIPTION = (
    "Engine container image. Defaults to a pinned image per engine ("
    + "; ".join(f"{f.NAME}: {f.IMAGE}" for f in SHIPPED)
    + ")."
)
