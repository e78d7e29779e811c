"""Engine facts: what each inference engine is, as data.

One package per engine: its name, pinned version and image, port, the HTTP
paths the operator, the gateway and doctor call, the flags the rules render
and the environment variables the operator manages, in its `__init__.py`
(data only, no imports). The API, the rules, the renderer, the gateway and
doctor all read these, so each is written exactly once
(tests/unit/test_engine_home.py greps the tree for copies).

Here: the facts that code outside engines/ looks up by an engine's name
(`facts`) instead of branching on it. The gateway runs in the pod from the
operator image and reads only these: not the adapters (engines/registry.py),
which import the renderer.
"""

from __future__ import annotations

from typing import Protocol

from localmodel.engines import llama_server, ollama


class EngineFacts(Protocol):
    """The facts each engine's `__init__` spells, as the gateway reads them."""

    NAME: str  # spec.engine.name, the gateway's --engine
    PORT: int  # the server's port in the pod
    # Readiness: where the gateway asks whether the model serves. LOAD_PATH
    # None: the engine loads its one model at start and SERVING_PATH answers
    # 200 once it serves. Else SERVING_PATH lists the loaded models (as
    # Ollama's /api/ps does) and, while ours is not among them, the gateway
    # loads it with a generation without a prompt at LOAD_PATH.
    SERVING_PATH: str
    LOAD_PATH: str | None
    # The speed calibration: the generation route the gateway calls (one of
    # the routes it serves, which says the body's shape) and the engine's own
    # fields added to that body.
    CALIBRATION_PATH: str
    CALIBRATION_BODY: dict[str, object]


ENGINES: tuple[EngineFacts, ...] = (ollama, llama_server)
BY_NAME: dict[str, EngineFacts] = {e.NAME: e for e in ENGINES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The engine a LocalModel and the gateway run when none is named.
DEFAULT: EngineFacts = ollama


def facts(name: str) -> EngineFacts:
    """The facts of the engine named so (KeyError: no such engine)."""
    return BY_NAME[name]
