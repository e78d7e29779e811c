"""Each engine's reading of its own account of a generation: the module
`timing` of its package (engines/<name>/timing.py, a `TimingReader`), found
beside its facts so that the gateway and the router ask the engine instead of
guessing by an answer's shape, and a new engine's package brings its own.

Imports only the facts (the gateway runs in the pod and imports no adapter);
the timing modules import only gateway_contract/timing.py.
"""

from __future__ import annotations

import functools
import importlib
from typing import cast

from localmodel.engines import FACTS, facts, package
from localmodel.gateway_contract.timing import TimingReader


class NoTimingReader(LookupError):
    """An engine's package without a timing module shaped as a `TimingReader`."""


@functools.cache
def reader(name: str) -> TimingReader:
    """The timing reader of the engine named so (KeyError: no such engine;
    NoTimingReader: its package has none)."""
    where = f"{package(facts(name))}.timing"
    try:
        module = importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name != where:
            raise
        raise NoTimingReader(f"engine {name}: no module {where} (each engine's package "
                             "says how its answers carry its timings)") from exc
    keys = getattr(module, "KEYS", None)
    if not (isinstance(keys, tuple) and all(isinstance(k, str) for k in keys)
            and callable(getattr(module, "timing", None))):
        raise NoTimingReader(f"engine {name}: {where} has no KEYS (a tuple of field names) "
                             "or no timing(answer, finish_reason)")
    return cast(TimingReader, module)


def readers() -> tuple[TimingReader, ...]:
    """Every engine's timing reader, in the registry's order (the router, which
    does not know which engine answered, asks them in turn)."""
    return tuple(reader(e.NAME) for e in FACTS)
