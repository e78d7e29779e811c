"""Engine facts: what each inference engine is, as data (no logic).

One module per engine: its name, pinned version and image, port, the HTTP
paths the operator, the gateway and doctor call, the flags the rules render
and the environment variables the operator manages. The API, the rules, the
renderer, the gateway and doctor all read these, so each is written exactly
once (tests/unit/test_engine_home.py greps the tree for copies).

`FACTS` lists every engine's facts module; the API builds spec.engine.name's
values, the default images, the managed variables and the engine-scoped
cross-field rules from it (localmodel.api.engine, localmodel.api.rules), so
adding an engine adds no branch there. Importing this package imports only
the facts modules, never an adapter.
"""

from __future__ import annotations

from typing import Protocol

from localmodel.engines import llama_server, ollama


class EngineFacts(Protocol):
    """The facts every engine's module declares for the API (mypy checks each module)."""

    NAME: str  # spec.engine.name
    TITLE: str  # how prose names the engine
    SUMMARY: str  # what it does with spec.model and spec.gguf, for spec.engine.name's text
    IMAGE: str  # the pinned default image
    MANAGED_ENV: tuple[str, ...]  # variables the operator sets: the API refuses them in spec.env
    NEEDS_GGUF: bool  # it serves spec.gguf only: the API requires it
    KEEP_ALIVE: bool  # it honours spec.keepAlive: otherwise the API refuses one but -1
    SAFE_CPU_PATH: bool  # placement.safeCpuPath means something: otherwise the API refuses it


# Every engine's facts, in the order the API lists them (spec.engine.name's enum).
FACTS: tuple[EngineFacts, ...] = (ollama, llama_server)
