"""Engine facts: what each inference engine is, as data (no logic).

One package per engine: its name, pinned version and image, port, the HTTP
paths the operator, the gateway and doctor call, the flags the rules render
and the environment variables the operator manages, in its `__init__.py`
(data only, no imports). The API, the rules, the renderer, the gateway and
doctor all read these, so each is written exactly once
(tests/unit/test_engine_home.py greps the tree for copies).

Here: `FACTS`, every engine's facts module, and `facts(name)`, which code
outside engines/ looks up by an engine's name instead of branching on it. The
API builds spec.engine.name's values, the default images, the managed
variables and the engine-scoped cross-field rules from `FACTS`
(localmodel.api.engine, localmodel.api.rules). Importing this package imports
only the facts modules, never an adapter (engines/registry.py, which imports
the rules): the gateway runs in the pod and reads only these.
"""

from __future__ import annotations

from typing import Protocol

from localmodel.engines import llama_server, ollama


class EngineFacts(Protocol):
    """The facts every engine's `__init__` declares (mypy checks each module)."""

    __name__: str  # its package's import name (engines/timings.py finds its timing module in it)
    NAME: str  # spec.engine.name, the gateway's --engine
    TITLE: str  # how prose names the engine
    SUMMARY: str  # what it does with spec.model and spec.gguf, for spec.engine.name's text
    IMAGE: str  # the pinned default image
    PORT: int  # the server's port in the pod
    # The variable its own clients read for its address (`host:port`, scheme
    # optional): doctor --local's default engine URL; None: it has none.
    HOST_ENV: str | None
    MANAGED_ENV: tuple[str, ...]  # variables the operator sets: the API refuses them in spec.env
    NEEDS_GGUF: bool  # it serves spec.gguf only: the API requires it
    KEEP_ALIVE: bool  # it honours spec.keepAlive: otherwise the API refuses one but -1
    SAFE_CPU_PATH: bool  # placement.safeCpuPath means something: otherwise the API refuses it
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


# Every engine's facts, in the order the API lists them (spec.engine.name's enum).
FACTS: tuple[EngineFacts, ...] = (ollama, llama_server)
BY_NAME: dict[str, EngineFacts] = {e.NAME: e for e in FACTS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The engine a LocalModel and the gateway run when none is named.
DEFAULT: EngineFacts = ollama


def facts(name: str) -> EngineFacts:
    """The facts of the engine named so (KeyError: no such engine)."""
    return BY_NAME[name]
