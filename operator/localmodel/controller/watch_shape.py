"""What a watch keeps of an object: only the fields its shape names, compactly,
and a refusal to read anything else. Pure.

A `Shape` is a tree of field names (the table in `watched.py` has one per
watched kind). `Shape.keep(body)` copies those fields out of an API object
into `Kept` mappings: a tuple of values per level, the field names held once
by the shape, strings interned (label keys, images, condition types and most
values repeat across thousands of objects), lists as tuples. The rest of the
body is dropped.

The operator's readers (`objects.py`, `volumes.py`, `facts/node.py`,
`facts/pod.py`) read a `Kept` as they read any mapping. A read of a field the
shape does not name (`kept["spec"]["hostNetwork"]`, `.get(...)`, `in`) raises
`NotKept`, naming the kind, the field and where the table is: it can neither
return "absent" by mistake nor be caught as a missing key (`NotKept` is no
`KeyError`). A field the shape names and the object lacks reads as absent, as
on a dict.

Leaves: `SCALAR` (a string, number, bool or null, kept as it is), `MAP` (a
free-form string map, e.g. labels: kept whole), `Only(keys)` (a free-form
map of which only these keys are kept; reading another key raises), `WHOLE`
(any JSON value kept whole, for what a parser reads in full: a LocalModel's
spec). A list of objects is `[Shape]`. A value whose type does not fit its
shape (a string where a mapping belongs) is kept as it is, so the reader
reports it as it would on the raw object; the API server validates the
built-in kinds, so this only happens to custom resources.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TABLE = "controller/watched.py, docs/operator.md#what-the-watches-keep"


class NotKept(Exception):
    """A read of a field the watches drop: the table and the code disagree.
    Deliberately no `KeyError` (a reader's "absent" branch must not swallow it)
    nor `ValueError`/`TypeError` (what readers catch for a bad object)."""


class _Absent:
    """The one marker of a field the object does not have."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


class Leaf:
    """A field kept whole: `SCALAR`, `MAP`, `WHOLE`; `Only(...)`: some keys of a map."""

    __slots__ = ("keys", "what")

    def __init__(self, what: str, keys: frozenset[str] | None = None) -> None:
        self.what, self.keys = what, keys


SCALAR = Leaf("value")
MAP = Leaf("map, whole")
WHOLE = Leaf("whole")


def Only(*keys: str) -> Leaf:  # reads as a leaf kind in the table
    return Leaf(", ".join(f"`{k}`" for k in keys) + " only", frozenset(keys))


Spec = Leaf | dict[str, "Spec"] | list["Spec"]


class Node:
    """A compiled field of a shape: keeps a value, and says what it keeps."""

    __slots__ = ()

    def keep(self, value: Any) -> Any:
        raise NotImplementedError

    def fields(self, path: str) -> Iterator[tuple[str, str]]:
        raise NotImplementedError


class _Whole(Node):
    """A shape node that keeps its value whole (interned)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def keep(self, value: Any) -> Any:
        return _intern_deep(value)

    def fields(self, path: str) -> Iterator[tuple[str, str]]:
        yield path, self.what


class _Only(Node):
    """A shape node that keeps only the named keys of a map."""

    __slots__ = ("keys", "kind", "path", "what")

    def __init__(self, leaf: Leaf, kind: str, path: str) -> None:
        assert leaf.keys is not None
        self.keys, self.kind, self.path, self.what = leaf.keys, kind, path, leaf.what

    def keep(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return _intern_deep(value)
        return OnlyMap(self, {sys.intern(str(k)): _intern_deep(v) for k, v in value.items()
                              if k in self.keys})

    def fields(self, path: str) -> Iterator[tuple[str, str]]:
        yield path, "map: " + self.what


class _List(Node):
    """A shape node that keeps each item of a list by its item's shape."""

    __slots__ = ("item",)

    def __init__(self, item: Node) -> None:
        self.item = item

    def keep(self, value: Any) -> Any:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            return _intern_deep(value)
        return tuple(self.item.keep(v) for v in value)

    def fields(self, path: str) -> Iterator[tuple[str, str]]:
        yield from self.item.fields(path + "[]")


class Shape(Node):
    """The fields kept of one level of an object, compiled from a nested dict
    (`{"metadata": {"name": SCALAR, "labels": MAP}, "spec": {...}}`)."""

    __slots__ = ("children", "index", "kind", "names", "path")

    def __init__(self, kind: str, spec: Mapping[str, Spec], path: str = "") -> None:
        self.kind, self.path = kind, path
        self.names = tuple(sys.intern(k) for k in spec)
        self.index = {k: i for i, k in enumerate(self.names)}
        self.children = tuple(_compile(kind, s, _join(path, k)) for k, s in spec.items())

    def keep(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return _intern_deep(value)
        return Kept(self, tuple(ABSENT if (v := value.get(k, ABSENT)) is ABSENT else c.keep(v)
                                for k, c in zip(self.names, self.children, strict=True)))

    def fields(self, path: str = "") -> Iterator[tuple[str, str]]:
        """(field path, what is kept of it) for every leaf, in table order."""
        for name, child in zip(self.names, self.children, strict=True):
            yield from child.fields(_join(path, name))


def _compile(kind: str, spec: Spec, path: str) -> Node:
    if isinstance(spec, Leaf):
        return _Only(spec, kind, path) if spec.keys is not None else _Whole(spec.what)
    if isinstance(spec, list):
        (item,) = spec
        return _List(_compile(kind, item, path + "[]"))
    return Shape(kind, spec, path)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _intern_deep(value: Any) -> Any:
    """`value` with every string interned; JSON's own types (a parser reads it)."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): _intern_deep(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_intern_deep(v) for v in value]
    return value


class Kept(Mapping[str, Any]):
    """One level of a kept object: reads as a read-only mapping of the fields
    its shape names; any other field raises `NotKept`."""

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: tuple[Any, ...]) -> None:
        self._shape, self._values = shape, values

    def __getitem__(self, key: str) -> Any:
        i = self._shape.index.get(key)
        if i is None:
            raise NotKept(f"{self._shape.kind}: {_join(self._shape.path, str(key))} is not "
                          f"kept by the watch (what is: {TABLE})")
        value = self._values[i]
        if value is ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:  # the readers' hot path
        i = self._shape.index.get(key)
        if i is None:
            self[key]  # raises NotKept
        value = self._values[i]  # type: ignore[index]
        return default if value is ABSENT else value

    def __contains__(self, key: object) -> bool:
        return self.get(str(key), ABSENT) is not ABSENT

    def __iter__(self) -> Iterator[str]:
        return (k for k, v in zip(self._shape.names, self._values, strict=True)
                if v is not ABSENT)

    def __len__(self) -> int:
        return sum(1 for v in self._values if v is not ABSENT)

    def __repr__(self) -> str:
        return f"Kept({dict(self)!r})"


class OnlyMap(Mapping[str, Any]):
    """A free-form map of which only some keys are kept; reading another raises."""

    __slots__ = ("_data", "_only")

    def __init__(self, only: _Only, data: dict[str, Any]) -> None:
        self._only, self._data = only, data

    def __getitem__(self, key: str) -> Any:
        if key not in self._only.keys:
            raise NotKept(f"{self._only.kind}: {self._only.path}[{key!r}] is not kept by "
                          f"the watch (what is: {TABLE})")
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"OnlyMap({self._data!r})"


def plain(value: Any) -> Any:
    """A kept object as plain JSON again (dicts and lists): for a copy to edit
    or to print; the operator itself never needs one."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
