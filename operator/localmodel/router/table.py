"""What the router routes over: each model's Ready replicas. Pure data.

A `ReplicaSource` answers `routes()` with the current table; the static one
(router/static.py, `--replicas`) and the cluster's (router/source.py) are the
two sources. The router asks again whenever it routes, so a source that
follows the cluster is read fresh each time (it should answer from memory).

Names (docs/router.md, How the model field chooses): a requested name whose
text before the first slash could be a namespace's (an RFC 1123 label) is
`namespace/name` and means that namespace's model or none, whatever another
namespace serves; a bare name finds the one model serving exactly it. A
served name that itself reads as `namespace/name` (`library/qwen3`, or
`team-a/chat` served in team-b) is reached only qualified
(`team-b/team-a/chat`), so no namespace's model can capture another's name.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

# A namespace's name: an RFC 1123 label (Kubernetes' rule for namespaces).
NAMESPACE_PATTERN = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


@dataclass(frozen=True)
class Replica:
    """One replica the router may send to: its namespace, name, gateway and admin URLs, and uid."""

    namespace: str  # its model's namespace
    name: str  # the pod's name, or the URL (static)
    url: str  # the replica's gateway, e.g. http://10.0.0.7:8080
    admin_url: str | None  # its admin port (/speed), e.g. http://10.0.0.7:8090; None: unknown
    uid: str = ""  # the pod's uid (cluster): a pod made again under its name is a new replica

    @property
    def id(self) -> str:
        """The replica's one identity, the same on every router: `namespace/pod`
        (`@uid` after it when known). Everything the router keeps or decides per
        replica (owners, loads, rankings, what /slots and /speed said, in-flight
        counts, held tokens, logs, X-LocalModel-Replica) is keyed by it, so two
        namespaces' pods of one name are two replicas."""
        return f"{self.namespace}/{self.name}" + (f"@{self.uid}" if self.uid else "")


# How long a request for a sleeping model is held when its spec says nothing
# (spec.idle.holdSeconds' default, api/spec.py).
HOLD_SECONDS = 120.0
AWAKE, ASLEEP, WAKING = "Awake", "Asleep", "Waking"  # status.idle.state's values


@dataclass(frozen=True)
class IdleRoute:
    """What the router knows of a model that may sleep (`spec.idle` set): how
    long it holds a request for it, and what its status says of its sleep."""

    hold_seconds: float = HOLD_SECONDS  # spec.idle.holdSeconds
    state: str = ""  # status.idle.state: AWAKE, ASLEEP, WAKING or "" (not said)
    wake_message: str = ""  # status.idle.wake.message: why it is not awake yet
    last_wake_seconds: float | None = None  # status.idle.lastWake.seconds: its last wake took


@dataclass(frozen=True)
class ModelRoute:
    """One served model: its namespace, name, Ready replicas, whether it asks
    for keys, and what decides whether a request waits for it (its replicas
    wanted, its sleep)."""

    namespace: str
    name: str  # the served model name: what a request's `model` field says
    replicas: tuple[Replica, ...]  # Ready replicas only
    keyed: bool = False  # its gateway asks for API keys: listed only to keys it accepts
    localmodel: str = ""  # the LocalModel's name (its Service's); "" from --replicas
    wanted: int = 1  # spec.replicas: 0 is off, whatever its sleep
    idle: IdleRoute | None = None  # spec.idle set: it may sleep, and a request for it is held

    @property
    def qualified(self) -> str:
        """`namespace/name`, the spelling that is never ambiguous."""
        return f"{self.namespace}/{self.name}"

    @property
    def resource(self) -> str:
        """`namespace/<LocalModel name>`: the object to wake (the served name without one)."""
        return f"{self.namespace}/{self.localmodel or self.name}"


RouteTable = tuple[ModelRoute, ...]


class ReplicaSource(Protocol):
    """Where the router's route table comes from: the cluster (router/follow.py) or a fixed
    one (router/static.py)."""

    def routes(self) -> RouteTable: ...


@dataclass(frozen=True)
class Found:
    """A model name that names one open model: its route."""

    route: ModelRoute


@dataclass(frozen=True)
class NotFound:
    """A model name no open model serves, and the names that are served."""

    asked: str
    known: tuple[str, ...]  # every open model's name as a request may spell it

    @property
    def message(self) -> str:
        known = ", ".join(self.known) if self.known else "none"
        return f"model {self.asked!r} is not served here; models: {known}"


@dataclass(frozen=True)
class Ambiguous:
    """A bare model name served in more than one namespace, and its choices."""

    asked: str
    choices: tuple[str, ...]  # namespace/name of each open model serving the bare name

    @property
    def message(self) -> str:
        choices = f"one of: {', '.join(self.choices)}" if self.choices else "it as namespace/name"
        return f"model {self.asked!r} is served in more than one namespace; name {choices}"


Lookup = Found | NotFound | Ambiguous


def split_qualified(asked: str) -> tuple[str, str] | None:
    """(namespace, name) when `asked` starts with a namespace's name and a
    slash: such a name always means that namespace's model, nothing else; None
    for a bare name (no slash, or a first segment no namespace can have, as
    `hf.co/...`)."""
    namespace, slash, name = asked.partition("/")
    if slash and name and _NAMESPACE.fullmatch(namespace):
        return namespace, name
    return None


def qualified_only(route: ModelRoute) -> bool:
    """Whether the served name itself reads as `namespace/name` (`team-a/chat`,
    `library/qwen3`): then only `<its namespace>/<served name>` reaches it."""
    return split_qualified(route.name) is not None


def qualified_only_notes(table: RouteTable) -> tuple[str, ...]:
    """One line per model reached only by its qualified name (logged once)."""
    return tuple(f"model {r.qualified}: its served name {r.name!r} reads as namespace/name, "
                 f"so the router reaches it only as {r.qualified!r}"
                 for r in table if qualified_only(r))


def listed_names(table: RouteTable, shown: Collection[str] | None = None) -> tuple[str, ...]:
    """The names the listing routes show, each one `lookup` finds: a bare name
    where one namespace serves it and it cannot be read as `namespace/name`,
    else `namespace/name`; only the models `shown` names (qualified) when it is
    given (router/keyed.py: who sees a keyed model)."""
    counts: dict[str, int] = {}
    for route in table:
        counts[route.name] = counts.get(route.name, 0) + 1
    return tuple(sorted(r.name if counts[r.name] == 1 and not qualified_only(r)
                        else r.qualified for r in table
                        if shown is None or r.qualified in shown))


def open_models(table: RouteTable) -> frozenset[str]:
    """The models that ask for no key (qualified): the only ones an error may name."""
    return frozenset(r.qualified for r in table if not r.keyed)


def lookup(table: RouteTable, asked: str) -> Lookup:
    """The model a request's `model` field names. A name whose text before the
    first slash is a namespace's name is `namespace/name` and nothing else:
    that namespace's model serving `name`, or not found (never another
    namespace's model, whatever it serves). Any other name is bare: the model
    serving exactly it, when one namespace does."""
    qualified = split_qualified(asked)
    if qualified is not None:
        for route in table:
            if (route.namespace, route.name) == qualified:
                return Found(route)
        return NotFound(asked, listed_names(table, open_models(table)))
    exact = tuple(r for r in table if r.name == asked)
    if len(exact) == 1:
        return Found(exact[0])
    if len(exact) > 1:
        return Ambiguous(asked, tuple(sorted(r.qualified for r in exact if not r.keyed)))
    return NotFound(asked, listed_names(table, open_models(table)))
