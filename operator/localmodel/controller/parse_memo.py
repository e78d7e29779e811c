"""The memo layer of `snapshot.observe` (`Parsed`): each stored version of a
LocalModel or Node parsed once, keyed on (uid, resourceVersion); every other
object's reading keyed on the identity of the stored object; each section of the
last `Observed` keyed on its objects and settings. Pure.

It saves the plain path's reading of every object of every pass (`observe`
with a fresh `Parsed` is that path); a section whose objects are the same ones
is taken as it is, and a section where a watch's index replaced a few objects
in place reads only those again (`models_again`, `nodes_again`).
tests/controller/test_pass_incremental.py holds a kept `Parsed` equal to a fresh one
over random sequences of events."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import Any, TypeVar, cast

from localmodel.controller.objects import ModelObject, Raw, metadata, parse_model
from localmodel.controller.observed import Observed
from localmodel.facts import NodeFacts
from localmodel.facts.node import NodeFactsError, from_node

T = TypeVar("T")
S = TypeVar("S")


StoredVersion = tuple[str, str]  # (uid, resourceVersion): one stored version of an object


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
    same ones is taken as it is. tests/controller/test_pass_incremental.py holds
    the result equal to a fresh `observe` over random sequences of events."""

    models: dict[StoredVersion, ModelObject] = field(default_factory=dict)
    nodes: dict[StoredVersion, NodeFacts | str] = field(default_factory=dict)  # str: why it is bad
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


def version_of(body: Raw) -> StoredVersion | None:
    meta = metadata(body)
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    return (str(uid), str(rv)) if uid and rv else None


def node_facts(body: Raw) -> NodeFacts | str:
    try:
        return from_node(body)
    except (NodeFactsError, ValueError, TypeError) as exc:
        return str(exc)


MAX_REPLACED = 64  # more objects replaced since the last pass: read the section anew


def _replaced(before: list[Raw], bodies: Sequence[Raw], read: dict[int, tuple[Raw, Any]]
              ) -> list[tuple[int, Any]] | None:
    """Where `bodies` holds another object than `before` (replaced in place), with
    what was read of the one replaced; None past MAX_REPLACED or if it was not read."""
    moved = list(compress(range(len(bodies)), map(is_not, before, bodies)))
    if len(moved) > MAX_REPLACED:
        return None
    found = []
    for i in moved:
        old = read.get(id(before[i]))
        if old is None or old[0] is not before[i]:
            return None
        found.append((i, old[1]))
    return found


def model_reading(body: Raw, memo: Parsed) -> tuple[StoredVersion | None, ModelObject]:
    version = version_of(body)
    m = memo.models.get(version) if version else None
    return version, parse_model(body) if m is None else m


def models_again(bodies: Sequence[Raw], watched: frozenset[str], memo: Parsed
                  ) -> dict[str, ModelObject] | None:
    """The last models section with the few objects that are not the same ones
    read again (a watch's index replaced them in place: a status written, an
    edit); None unless that is all that changed, each under the same name."""
    kept = memo.sections.get("models")
    if kept is None or len(kept[0][0]) != len(bodies) or kept[0][1] != watched:
        return None
    before: list[Raw] = kept[0][0]
    old_models: dict[str, ModelObject] = kept[1]
    read = memo.read.get("localmodels", {})
    if (replaced := _replaced(before, bodies, read)) is None:
        return None
    again = []
    for i, (old_version, was) in replaced:
        version, m = model_reading(bodies[i], memo)
        shown = not watched or m.namespace in watched
        if m.key != was.key or (shown and old_models.get(m.key) is not was):
            return None  # (another name, or not the object the section holds)
        again.append((before[i], bodies[i], old_version, version, m, shown))
    models = dict(old_models)
    for was_body, body, old_version, version, m, shown in again:
        del read[id(was_body)]
        read[id(body)] = (body, (version, m))
        if old_version:
            memo.models.pop(old_version, None)
        if version:
            memo.models[version] = m
        if shown:
            models[m.key] = m
    return models

def node_reading(body: Raw, memo: Parsed) -> tuple[str, StoredVersion | None, NodeFacts | str]:
    version = version_of(body)
    facts = memo.nodes.get(version) if version else None
    return (str(metadata(body).get("name") or ""), version,
            node_facts(body) if facts is None else facts)


def nodes_again(bodies: Sequence[Raw], memo: Parsed
                 ) -> tuple[dict[str, NodeFacts], dict[str, str]] | None:
    """The last nodes section with the few objects that are not the same ones
    read again (a watch's index replaced them in place); None unless that is
    all that changed, each under the same name, still good or still bad."""
    kept = memo.sections.get("nodes")
    if kept is None or len(kept[0][0]) != len(bodies):
        return None
    before: list[Raw] = kept[0][0]
    old_nodes, old_bad = kept[1]
    if len(old_nodes) + len(old_bad) != len(bodies):  # (no name twice)
        return None
    read = memo.read.get("nodes", {})
    if (replaced := _replaced(before, bodies, read)) is None:
        return None
    again = []
    for i, (old_name, old_version, old_facts) in replaced:
        name, version, facts = reading = node_reading(bodies[i], memo)
        if (name, isinstance(facts, str)) != (old_name, isinstance(old_facts, str)) or any(
                not isinstance(f, str) and f.name != name for f in (facts, old_facts)):
            return None
        again.append((before[i], bodies[i], old_version, reading))
    nodes, bad = dict(old_nodes), dict(old_bad)
    for was, body, old_version, (name, version, facts) in again:
        del read[id(was)]
        read[id(body)] = (body, (name, version, facts))
        memo.nodes.pop(old_version, None)
        if version:
            memo.nodes[version] = facts
        if isinstance(facts, str):
            bad[name] = facts
        else:
            nodes[name] = facts
    memo.nodes_since = (old_nodes, nodes, frozenset(
        name for _, _, _, (name, _, facts) in again if old_nodes.get(name) is not facts))
    return nodes, bad

