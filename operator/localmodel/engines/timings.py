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


@functools.cache
def reader(name: str) -> TimingReader:
    """The timing reader of the engine named so (KeyError: no such engine)."""
    module = importlib.import_module(f"{package(facts(name))}.timing")
    return cast(TimingReader, module)


def readers() -> tuple[TimingReader, ...]:
    """Every engine's timing reader, in the registry's order (the router, which
    does not know which engine answered, asks them in turn)."""
    return tuple(reader(e.NAME) for e in FACTS)
