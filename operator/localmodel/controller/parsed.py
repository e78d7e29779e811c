"""What `observe` keeps between passes (`Parsed`), and which stored version
of an object a body is (`version_of`). Pure data; `observed.py` uses it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from localmodel.controller.objects import ModelObject, Raw, metadata
from localmodel.facts import NodeFacts

if TYPE_CHECKING:
    from localmodel.controller.observed import Observed

T = TypeVar("T")
S = TypeVar("S")


Version = tuple[str, str]  # (uid, resourceVersion): one stored version of an object


@dataclass
class Parsed:
    """Keeps what `observe` read between passes, keyed on each stored object's
    version (LocalModels, Nodes) or identity (the rest), so a pass costs what changed.

    LocalModels and Nodes parsed, by stored version: each stored version is
    parsed once and the same parsed object comes back (the long-lived
    `Desired` compares models by identity). The other objects read, by the
    identity of the stored object (a watch's index replaces an object it
    keeps on each event and leaves the others as they are; the object is held
    here, so its identity is not reused). Each section of the last
    `Observed` with what it was made from: a section whose objects are the
    same ones is taken as it is. tests/unit/test_pass_incremental.py holds
    the result equal to a fresh `observe` over random sequences of events."""

    models: dict[Version, ModelObject] = field(default_factory=dict)
    nodes: dict[Version, NodeFacts | str] = field(default_factory=dict)  # str: why it is bad
    read: dict[str, dict[int, tuple[Raw, Any]]] = field(default_factory=dict)
    # section -> (what it read: the objects and the settings, what it made)
    sections: dict[str, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)
    last: Observed | None = None
    # (nodes before, nodes after, the names that changed) of the last reading of
    # a few nodes' new objects (`_nodes_again`)
    nodes_since: tuple[Any, Any, frozenset[str]] | None = None
    # (the models, their valid uids, whether those are the last models' very set)
    valid: tuple[dict[str, ModelObject], frozenset[str], bool] | None = None

    def each(self, kind: str, bodies: Sequence[Raw], read: Callable[[Raw], T]) -> list[T]:
        """`read` of each object, kept from the last call for the same objects."""
        before = self.read.get(kind, {})
        now: dict[int, tuple[Raw, Any]] = {}
        out: list[T] = []
        for body in bodies:
            kept = before.get(id(body))
            if kept is None or kept[0] is not body:
                kept = (body, read(body))
            now[id(body)] = kept
            out.append(kept[1])
        self.read[kind] = now
        return out

    def section(self, name: str, bodies: tuple[Sequence[Raw], ...], settings: tuple[Any, ...],
                make: Callable[[], S]) -> tuple[S, bool]:
        """The section `name` of this snapshot, and whether it is the last one:
        the same objects (compared by identity first, then by value), in the
        same order, with the same settings."""
        key = (*(list(b) for b in bodies), *settings)
        kept = self.sections.get(name)
        if kept is not None and kept[0] == key:
            return cast(S, kept[1]), True
        value = make()
        self.sections[name] = (key, value)
        return value, False


def version_of(body: Raw) -> Version | None:
    meta = metadata(body)
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    return (str(uid), str(rv)) if uid and rv else None
