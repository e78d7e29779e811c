"""What the router routes over: each model's Ready replicas. Pure data.

A `ReplicaSource` answers `routes()` with the current table; the static one
(router/static.py, `--replicas`) and the cluster's (router/source.py) are the
two sources. The router asks again whenever it routes, so a source that
follows the cluster is read fresh each time (it should answer from memory).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Replica:
    name: str  # stable across the router's replicas: the pod's name, or the URL (static)
    url: str  # the replica's gateway, e.g. http://10.0.0.7:8080
    admin_url: str | None  # its admin port (/speed), e.g. http://10.0.0.7:8090; None: unknown


@dataclass(frozen=True)
class ModelRoute:
    namespace: str
    name: str  # the served model name: what a request's `model` field says
    replicas: tuple[Replica, ...]  # Ready replicas only
    keyed: bool = False  # its gateway asks for API keys: listed only to keys it accepts

    @property
    def qualified(self) -> str:
        """`namespace/name`, the spelling that is never ambiguous."""
        return f"{self.namespace}/{self.name}"


RouteTable = tuple[ModelRoute, ...]


class ReplicaSource(Protocol):
    def routes(self) -> RouteTable: ...


@dataclass(frozen=True)
class Found:
    route: ModelRoute


@dataclass(frozen=True)
class NotFound:
    asked: str
    known: tuple[str, ...]  # every open model's name as a request may spell it

    @property
    def message(self) -> str:
        known = ", ".join(self.known) if self.known else "none"
        return f"model {self.asked!r} is not served here; models: {known}"


@dataclass(frozen=True)
class Ambiguous:
    asked: str
    choices: tuple[str, ...]  # namespace/name of each open model serving the bare name

    @property
    def message(self) -> str:
        choices = f"one of: {', '.join(self.choices)}" if self.choices else "it as namespace/name"
        return f"model {self.asked!r} is served in more than one namespace; name {choices}"


Lookup = Found | NotFound | Ambiguous


def listed_names(table: RouteTable, shown: Collection[str] | None = None) -> tuple[str, ...]:
    """The names the listing routes show: a bare name where it is unique, else
    `namespace/name` for each model that shares it; only the models `shown`
    names (qualified) when it is given (router/keyed.py: who sees a keyed model)."""
    counts: dict[str, int] = {}
    for route in table:
        counts[route.name] = counts.get(route.name, 0) + 1
    return tuple(sorted(r.name if counts[r.name] == 1 else r.qualified for r in table
                        if shown is None or r.qualified in shown))


def open_models(table: RouteTable) -> frozenset[str]:
    """The models that ask for no key (qualified): the only ones an error may name."""
    return frozenset(r.qualified for r in table if not r.keyed)


def lookup(table: RouteTable, asked: str) -> Lookup:
    """The model a request's `model` field names: `namespace/name` always, a
    bare name when one namespace serves it. A served name may itself hold a
    slash (Ollama's `library/x`): an exact served name wins over the split."""
    exact = tuple(r for r in table if r.name == asked)
    if len(exact) == 1:
        return Found(exact[0])
    if len(exact) > 1:
        return Ambiguous(asked, tuple(sorted(r.qualified for r in exact if not r.keyed)))
    namespace, slash, name = asked.partition("/")
    if slash:
        for route in table:
            if route.namespace == namespace and route.name == name:
                return Found(route)
    return NotFound(asked, listed_names(table, open_models(table)))
