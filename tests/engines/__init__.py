"""Test-only engines: one package each, shaped like a shipped engine's
(operator/localmodel/engines/<name>/: its facts in `__init__.py`, `adapter.py`
exposing `ADAPTER`, `rules.py` with its own rules if any), each with the
stand-in server the tests start and its own golden renders.

tests/conftest.py registers every package here for the whole session through
`ENV` (comma-separated importable package names, which the engine registry
reads), before anything imports the registry; the programs the tests start
(the gateway, the router) inherit it. The conformance suite
(tests/conformance/) then runs over them as over the shipped engines.
Importing this package imports nothing of the operator."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# The variable the registry reads (localmodel.engines).
ENV = "LOCALMODEL_ENGINE_PACKAGES"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository: `tests` is importable from it


def packages() -> tuple[str, ...]:
    """Every engine package under tests/engines/, as importable names."""
    return tuple(
        f"{__name__}.{p.name}" for p in sorted(HERE.iterdir())
        if p.is_dir() and (p / "__init__.py").exists()
    )


def register(environ: MutableMapping[str, str] = os.environ) -> None:
    """Add every package here to `ENV` in `environ` (kept: any already named),
    and the repository's root to `PYTHONPATH`, so that every program a test
    starts, from any directory (the kubectl plugin, the operator, the gateway,
    the router), can import what `ENV` names; without it the registry refuses
    to start, naming the package it cannot import."""
    named = [n for n in environ.get(ENV, "").split(",") if n]
    environ[ENV] = ",".join([*named, *(p for p in packages() if p not in named)])
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        environ["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
