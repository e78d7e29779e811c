"""Every engine's adapter and own rules by its name (`spec.engine.name`), found
from the facts registry (`localmodel.engines.FACTS`): each engine package's
`adapter.ADAPTER` and, if it has one, `rules.RULES`. One registration: the
facts registry says which engines there are (shipped, then those named by
`LOCALMODEL_ENGINE_PACKAGES`), this module imports their parts, so the two
name the same engines in the same order by construction."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping

from localmodel.engines import ENV, FACTS, SHIPPED, EngineFacts, EngineRegistryError, package
from localmodel.engines.adapter import Engine
from localmodel.rules.model import Rule, Stage


def _adapter(f: EngineFacts) -> Engine:
    where = f"{package(f)}.adapter"
    try:
        adapter = importlib.import_module(where).ADAPTER
    except (ImportError, AttributeError) as e:
        raise EngineRegistryError(
            f"engine {f.NAME!r}: {where} exposes no ADAPTER ({ENV} names out-of-tree engines): "
            f"{e}") from e
    if not isinstance(adapter, Engine) or adapter.name != f.NAME:
        raise EngineRegistryError(f"engine {f.NAME!r}: {where}.ADAPTER is not its Engine")
    return adapter


def _rules(f: EngineFacts) -> Mapping[Stage, tuple[Rule, ...]]:
    where = f"{package(f)}.rules"
    if importlib.util.find_spec(where) is None:
        return {}
    rules: Mapping[Stage, tuple[Rule, ...]] = importlib.import_module(where).RULES
    return rules


ENGINES: dict[str, Engine] = {f.NAME: _adapter(f) for f in FACTS}
# Each engine's own rules, by the stage they run at (rules/table.py places them).
OWN_RULES: dict[str, Mapping[Stage, tuple[Rule, ...]]] = {f.NAME: _rules(f) for f in FACTS}
# The shipped engines' names, in the API's order (the CRD and docs/rules.md show these).
SHIPPED_NAMES: tuple[str, ...] = tuple(f.NAME for f in SHIPPED)


def engine(name: str) -> Engine:
    """The adapter of the engine named so (KeyError: no such engine)."""
    return ENGINES[str(name)]
