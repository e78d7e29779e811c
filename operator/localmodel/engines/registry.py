"""Every engine's adapter by its name (`spec.engine.name`). Adding an engine:
its package under engines/ and one entry here."""

from __future__ import annotations

from localmodel.engines.adapter import Engine
from localmodel.engines.llama_server.adapter import ADAPTER as LLAMA_SERVER
from localmodel.engines.ollama.adapter import ADAPTER as OLLAMA

ENGINES: dict[str, Engine] = {a.name: a for a in (OLLAMA, LLAMA_SERVER)}


def engine(name: str) -> Engine:
    """The adapter of the engine named so (KeyError: no such engine)."""
    return ENGINES[str(name)]
