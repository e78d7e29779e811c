"""Sorted JSON text put together around the strings that vary, so a digest
costs encoding those strings, not the object (`PodParts`' affinity and
volumes, `AppliedDigests`' objects)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from localmodel.render.digests import SORTED_JSON


class TextTemplate:
    """Keeps the sorted JSON text of an object some of whose strings vary, cut
    around them: `fill(*values)` is `json.dumps(make(*values),
    sort_keys=True)` without encoding the rest again.

    ``make`` builds the object from ``arity`` strings; each may stand anywhere
    in a string, any number of times, or nowhere (a string's JSON text is its
    characters', each escaped alone). A value whose index is in ``raw``
    stands, whole, for an object: it is given as that object's JSON text."""

    def __init__(self, make: Callable[..., Any], arity: int, raw: Sequence[int] = ()) -> None:
        marks = [mark(i) for i in range(arity)]
        text = SORTED_JSON.encode(make(*marks))
        self._slots: list[tuple[int, bool]] = []  # (value, raw) in the order they appear
        self._pieces: list[str] = []
        at = 0
        for found in _MARK.finditer(text):
            i, start, end = int(found.group(1)), found.start(), found.end()
            if i in raw:  # the whole string, quotes and all
                assert text[start - 1] == text[end] == '"', text
                start, end = start - 1, end + 1
            self._pieces.append(text[at:start])
            self._slots.append((i, i in raw))
            at = end
        self._pieces.append(text[at:])

    def fill(self, *values: str) -> str:
        encode, pieces = SORTED_JSON.encode, self._pieces
        out = [pieces[0]]
        for k, (i, raw) in enumerate(self._slots):
            out.append(values[i] if raw else encode(values[i])[1:-1])
            out.append(pieces[k + 1])
        return "".join(out)


def mark(i: int) -> str:
    """The string that stands for a template's value ``i`` (no name holds a NUL)."""
    return f"\x00{i}\x00"


_MARK = re.compile(r"\\u0000(\d+)\\u0000")  # `mark`'s characters, escaped
