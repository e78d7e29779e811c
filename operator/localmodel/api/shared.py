"""Equal parts of parsed objects held once. Pure (a table of live parts, no I/O).

API models are frozen, so two LocalModels whose `spec.gateway` say the same
thing can hold the same `Gateway`, and two statuses the same `DecisionStatus`.
At 5 000 models most parts repeat (a rule's decision texts, the default
gateway, storage and engine), and each parsed anew costs its object, its
`__dict__` and pydantic's set of the fields given (docs/benchmarks.md, issue 33).

`Shared(cls).part(raw)` gives the instance already made from equal input, or
validates `raw` once and keeps the result while anything holds it (a weak
table: nothing is kept for a part no object uses any more). Equal input
means equal JSON: the order of a mapping's keys does not count, so a shared
part's free-form maps (a node selector, settings) keep the order of the
input that made it, equal as a dict to every other. Input that does
not validate on its own is given back unchanged, so the whole object's
validation reports it where it is, as before. A part is validated without
its parent, so only parts whose validation reads nothing outside themselves
(no validation context, no parent's fields) may be shared.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

_SCALARS = (str, int, float, bool, type(None))


def frozen(value: Any, depth: int = 0) -> Hashable:
    """A hashable value equal exactly when the JSON values are: a scalar with
    its type (1, 1.0 and True validate differently), a mapping's items in key
    order (the API server sends a custom resource's keys sorted, the operator
    builds them in field order: the same part either way). `ValueError` for
    input that is not JSON, keys that are not strings, or nesting deeper than
    any valid part."""
    if isinstance(value, str):
        return value
    if isinstance(value, _SCALARS):
        return (type(value), value)
    if depth > 16:
        raise ValueError("nested too deeply to share")
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("a key that is not a string")
        return ("{", tuple((k, frozen(value[k], depth + 1)) for k in sorted(value)))
    if isinstance(value, list | tuple):
        return ("[", tuple(frozen(v, depth + 1) for v in value))
    raise ValueError(f"{type(value).__name__} is not JSON")


class Shared(Generic[M]):
    """Parts of one model class, equal input -> one instance (while in use)."""

    __slots__ = ("_cls", "_live")

    def __init__(self, cls: type[M]) -> None:
        self._cls = cls
        self._live: weakref.WeakValueDictionary[Hashable, M] = weakref.WeakValueDictionary()

    def part(self, raw: object) -> M | object:
        """The instance equal input made, else `raw` validated once; `raw`
        itself when it does not validate alone (or is already an instance)."""
        if not isinstance(raw, Mapping):
            return raw
        try:
            key = frozen(raw)
        except ValueError:
            return raw
        found = self._live.get(key)
        if found is None:
            try:
                found = self._cls.model_validate(raw)
            except (ValidationError, ValueError, TypeError):
                return raw
            self._live[key] = found
        return found

    def of(self, raw: Mapping[str, Any]) -> M:
        """`part` of input known valid (what the operator itself builds)."""
        found = self.part(raw)
        return found if isinstance(found, self._cls) else self._cls.model_validate(raw)

    def __len__(self) -> int:
        return len(self._live)
