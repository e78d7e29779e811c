"""Engine facts: what each inference engine is, as data (no logic), and the
facts registry: every engine, found, not listed.

One package per engine: its name, pinned version and image, port, the HTTP
paths the operator, the gateway and doctor call, the flags the rules render
and the environment variables the operator manages, in its `__init__.py`
(data only, no imports). The API, the rules, the renderer, the gateway and
doctor all read these, so each is written exactly once
(tests/architecture/test_engine_home.py greps the tree for copies).

Here: `FACTS`, every engine's facts module, and `facts(name)`, which code
outside engines/ looks up by an engine's name instead of branching on it.
The shipped engines (`SHIPPED`) are the subpackages of this package, in their
facts' `ORDER`; after them come the out-of-tree engines named by the
environment variable `LOCALMODEL_ENGINE_PACKAGES` (`ENV`: comma-separated
importable package names, each shaped like a shipped engine package: facts in
its `__init__.py`, `adapter.py` exposing `ADAPTER`, `rules.py` exposing its
`RULES` if it has rules of its own), in the order named. The API builds
spec.engine.name's values, the default images, the managed variables and the
engine-scoped cross-field rules from `FACTS` (localmodel.api.engine,
localmodel.api.rules); the CRD and the rules' docs show only `SHIPPED`.
Importing this package imports only the facts modules, never an adapter (the
adapter registry, engines/registry.py, finds each engine's parts from these
packages): the gateway runs in the pod and reads only these.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Protocol, cast

# The variable naming out-of-tree engine packages (a test-only engine's, say).
ENV = "LOCALMODEL_ENGINE_PACKAGES"


class EngineFacts(Protocol):
    """The facts every engine's `__init__` declares (tests/api/test_api.py checks each)."""

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
    # Its CPU libraries that crash on AMX hosts in some builds; empty: AMX is not
    # its concern, and the API refuses placement.safeCpuPath for it.
    AMX_LIBRARIES: tuple[str, ...]
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
    # Its load with the weights in the page cache, measured: a fixed cost (its
    # process, its buffers) and the work per GiB of weights (podspec's
    # expected_load_seconds adds the read from the volume).
    LOAD_FIXED_SECONDS: float
    LOAD_SECONDS_PER_GIB: float


class EngineRegistryError(ImportError):
    """An engine package that cannot be registered (named in `ENV`, or a duplicate name)."""


def _shipped() -> tuple[ModuleType, ...]:
    """This package's engine subpackages, in their facts' `ORDER`."""
    found = [importlib.import_module(f"{__name__}.{m.name}")
             for m in pkgutil.iter_modules(__path__) if m.ispkg]
    return tuple(sorted(found, key=lambda module: (module.ORDER, module.__name__)))


def _named(environ: Mapping[str, str]) -> tuple[ModuleType, ...]:
    """The out-of-tree engine packages `ENV` names, in its order."""
    out = []
    for package in (p.strip() for p in environ.get(ENV, "").split(",")):
        if not package:
            continue
        try:
            module = importlib.import_module(package)
        except ImportError as e:
            raise EngineRegistryError(
                f"{ENV}: engine package {package!r} cannot be imported: {e}") from e
        if not isinstance(getattr(module, "NAME", None), str):
            raise EngineRegistryError(
                f"{ENV}: engine package {package!r} declares no NAME (its facts, in __init__.py)")
        out.append(module)
    return tuple(out)


def registered(environ: Mapping[str, str]) -> tuple[EngineFacts, ...]:
    """Every engine's facts: the shipped ones, then those `environ[ENV]` names."""
    found = cast(tuple[EngineFacts, ...], (*_shipped(), *_named(environ)))
    names = [f.NAME for f in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise EngineRegistryError(f"{ENV}: engine name(s) {', '.join(twice)} registered twice")
    return found


# The engines this package ships, in the order the API lists them (the CRD's enum).
SHIPPED: tuple[EngineFacts, ...] = cast(tuple[EngineFacts, ...], _shipped())
# Every engine's facts, shipped then out-of-tree (spec.engine.name's values).
FACTS: tuple[EngineFacts, ...] = registered(os.environ)
BY_NAME: dict[str, EngineFacts] = {e.NAME: e for e in FACTS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The engine a LocalModel and the gateway run when none is named: the first
# shipped (decided here only; tests/architecture/test_facts_once.py).
DEFAULT: EngineFacts = SHIPPED[0]


def package(f: EngineFacts) -> str:
    """The importable package an engine's facts are the `__init__` of (its parts live there)."""
    return cast(ModuleType, f).__name__


def facts(name: str) -> EngineFacts:
    """The facts of the engine named so (KeyError: no such engine)."""
    return BY_NAME[name]
