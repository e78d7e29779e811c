"""Reading manifests safely: YAML or JSON from a file or stdin, bounded and strict.

What a hostile or careless file can do to a YAML reader, and what happens here:

- too big (or endless, `-f /dev/zero`): at most `MAX_BYTES` are read; more is refused.
  YAML is slow to read in Python (about a second per MiB here), so YAML may be at
  most `MAX_YAML_BYTES`; JSON (`kubectl get nodes -o json`) is read by the json
  module, fast, up to `MAX_BYTES`;
- not UTF-8: refused, with the offset of the first bad byte;
- nested thousands deep: refused past `MAX_DEPTH` levels, before any recursion;
- an alias bomb ("billion laughs"): aliases may add at most `ALIAS_BUDGET` nodes in
  all, and an alias may not refer to the node that contains it;
- duplicate keys: an error (PyYAML and many readers keep the last one silently);
- values JSON and the API server cannot carry (`!!binary`, `!!set`, `.inf`, integers
  beyond 64 bits, non-string keys): refused. YAML timestamps stay strings, as
  `kubectl` reads them.

Every refusal is a `ManifestError` naming the file (and the line where known).
Parsing uses libyaml when PyYAML has it; the checks run on the event stream, so
they cost one extra pass and no recursion.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

__all__ = [
    "ALIAS_BUDGET",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "MAX_YAML_BYTES",
    "ManifestError",
    "documents",
    "load_all",
    "read_bytes",
]

MAX_BYTES = 16 * 1024 * 1024  # JSON: about 15,000 Nodes as `kubectl get nodes -o json` prints
MAX_YAML_BYTES = 1024 * 1024  # YAML: about 1,000 Nodes, or thousands of LocalModels
MAX_VALUES = 1_000_000  # JSON values (objects, keys, items) in one file: ~20,000 Nodes
MAX_DEPTH = 100
ALIAS_BUDGET = 10_000
_INT64 = (-(2**63), 2**63 - 1)

_CORE = "tag:yaml.org,2002:"
# Explicit tags a manifest may carry: the JSON types (and merge keys).
_ALLOWED_TAGS = {
    f"{_CORE}{t}"
    for t in ("str", "int", "float", "bool", "null", "map", "seq", "merge", "timestamp")
} | {"!"}

_Base: Any = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


class ManifestError(ValueError):
    """Input that cannot be read as manifests: where (file, line) and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class _Refused(yaml.YAMLError):
    """A YAML construct the manifest reader refuses, with the reason and where it is."""

    def __init__(self, reason: str, mark: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.mark = mark


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _check_events(text: str) -> None:
    """Depth, alias expansion and tags, from the event stream (iterative, no recursion)."""
    loader = _Base(text)
    try:
        # Per open collection: [nodes inside so far, anchor or None].
        stack: list[list[Any]] = []
        sizes: dict[str, int] = {}  # anchor -> expanded size of its node
        open_anchors: set[str] = set()
        added = 0
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.DocumentStartEvent):
                sizes.clear()
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in open_anchors:
                    raise _Refused("an alias refers to the node that contains it", event.start_mark)
                size = sizes.get(str(event.anchor), 1)
                added += size
                if added > ALIAS_BUDGET:
                    raise _Refused(
                        f"aliases expand to more than {ALIAS_BUDGET} nodes", event.start_mark
                    )
                if stack:
                    stack[-1][0] += size
                continue
            tag = getattr(event, "tag", None)
            if tag is not None and tag not in _ALLOWED_TAGS:
                shown = tag.replace(_CORE, "!!")
                raise _Refused(
                    f"the tag {shown} is not allowed (JSON types only)", event.start_mark
                )
            if isinstance(event, yaml.CollectionStartEvent):
                if len(stack) >= MAX_DEPTH:
                    raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
                stack.append([1, event.anchor])
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
            elif isinstance(event, yaml.CollectionEndEvent):
                size, anchor = stack.pop()
                if anchor is not None:
                    open_anchors.discard(anchor)
                    sizes[anchor] = size
                if stack:
                    stack[-1][0] += size
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                if stack:
                    stack[-1][0] += 1
    finally:
        loader.dispose()


class _Loader(_Base):  # type: ignore[misc]
    """SafeLoader with JSON's types: strict keys, bounded numbers, timestamps as text."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == f"{_CORE}merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise _Refused(
                    f"mapping keys must be strings, not {type(key).__name__} {key!r}",
                    key_node.start_mark,
                )
            if key in seen:
                raise _Refused(f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(c.isdigit() for c in node.value)
        if digits > 20:
            raise _Refused("integer out of range (more than 64 bits)", node.start_mark)
        value: int = super().construct_yaml_int(node)
        if not _INT64[0] <= value <= _INT64[1]:
            raise _Refused("integer out of range (more than 64 bits)", node.start_mark)
        return value

    def construct_yaml_float(self, node: Any) -> float:
        value: float = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"{node.value!r} is not a finite number", node.start_mark)
        return value


_Loader.add_constructor(f"{_CORE}int", _Loader.construct_yaml_int)
_Loader.add_constructor(f"{_CORE}float", _Loader.construct_yaml_float)
_Loader.add_constructor(f"{_CORE}timestamp", _Loader.construct_yaml_str)
_Loader.add_constructor(f"{_CORE}value", _Loader.construct_yaml_str)  # "=" is text in JSON


def read_bytes(path: str, stdin: BinaryIO | None = None) -> bytes:
    """At most MAX_BYTES of a file, or of stdin for `-`."""
    try:
        if path == "-":
            data = (stdin or sys.stdin.buffer).read(MAX_BYTES + 1)
        else:
            with Path(path).open("rb") as f:
                data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ManifestError(path, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ManifestError(path, f"larger than {MAX_BYTES // 2**20} MiB")
    return data


def _load_json(text: str) -> list[Any]:
    """JSON with the same limits as YAML, at C speed: Python runs once per object (to
    refuse duplicate keys and count) and once per value after parsing (depth, numbers)."""
    objects = 0

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects += 1 + len(items)
        if objects > MAX_VALUES:
            raise _Refused(f"more than {MAX_VALUES} values")
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            dup = next(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise _Refused(f"duplicate key {dup!r}")
        return out

    def constant(name: str) -> Any:
        # NaN/Infinity are not JSON; as YAML (how kubectl reads them) they are strings.
        raise json.JSONDecodeError(f"{name} is not a JSON value", text, 0)

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except RecursionError:
        raise _Refused(f"nested deeper than {MAX_DEPTH} levels") from None
    _check_values(doc)
    return [doc]


def _check_values(doc: Any) -> None:
    """Depth, count and number ranges of a decoded JSON document, without recursion."""
    todo = [(doc, 1)]
    count = 1
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
            count += len(node)  # counted before anything is queued: memory stays bounded
            if count > MAX_VALUES:
                raise _Refused(f"more than {MAX_VALUES} values")
            children = node.values() if isinstance(node, dict) else node
            todo.extend((c, depth + 1) for c in children)
        elif isinstance(node, bool):
            continue
        elif isinstance(node, int) and not _INT64[0] <= node <= _INT64[1]:
            raise _Refused("integer out of range (more than 64 bits)")
        elif isinstance(node, float) and not math.isfinite(node):
            raise _Refused(f"{node!r} is not a finite number")


def _load_yaml(text: str) -> list[Any]:
    _check_events(text)
    loader = _Loader(text)
    try:
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
        return docs
    finally:
        loader.dispose()


def load_all(data: bytes, where: str) -> list[Any]:
    """Every document in `data` (JSON, or YAML), checked; `where` names it in errors."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(where, f"not UTF-8 text (byte {e.start})") from None
    text = text.removeprefix("\ufeff")
    try:
        not_json: json.JSONDecodeError | None = None
        if text.strip():  # JSON is YAML, but the json module reads it much faster
            try:
                return _load_json(text)
            except json.JSONDecodeError as e:
                not_json = e  # block or flow style YAML, or broken JSON
        if len(data) > MAX_YAML_BYTES:  # too big to be read as YAML
            if not_json is not None and text.lstrip()[:1] in ("{", "["):
                at = f"line {not_json.lineno}, column {not_json.colno}"
                raise _Refused(f"{at}: not valid JSON: {not_json.msg}")
            raise _Refused(
                f"larger than {MAX_YAML_BYTES // 2**20} MiB of YAML (JSON may be up to "
                f"{MAX_BYTES // 2**20} MiB: `kubectl get ... -o json`)"
            )
        return _load_yaml(text)
    except _Refused as e:
        raise ManifestError(where, _at(e.mark) + e.reason) from None
    except yaml.YAMLError as e:
        raise ManifestError(where, f"not valid YAML: {e}") from None
    except RecursionError:  # only without libyaml, and past MAX_DEPTH it cannot happen
        raise ManifestError(where, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # int() past Python's digit limit
        raise ManifestError(where, f"not a valid number: {e}") from None


def documents(path: str, stdin: BinaryIO | None = None) -> Iterator[tuple[str, Any]]:
    """(where, object) for every object in a file, `List` items included.

    `where` is `path`, `path[i]` for the i-th of several documents, and
    `...items[j]` inside a List.
    """
    docs = [d for d in load_all(read_bytes(path, stdin), path) if d is not None]
    for i, doc in enumerate(docs):
        where = f"{path}[{i}]" if len(docs) > 1 else path
        if isinstance(doc, dict) and doc.get("kind") in ("List", "LocalModelList"):
            items = doc.get("items")
            if items is None:
                continue
            if not isinstance(items, list):
                got = type(items).__name__
                raise ManifestError(where, f"items: must be a list of objects, not {got}")
            for j, item in enumerate(items):
                yield f"{where}.items[{j}]", item
        else:
            yield where, doc
