"""The digests the operator records on what it writes and compares to see
whether an object is stale, and the pass's optimisation of them: pods of
alike models share their containers and those containers' JSON text
(`PodParts`), and a model's digests are put together around its own strings
in text templates (`_TextTemplate`, `AppliedDigests`) rather than encoding
each object again. Each fast way is checked against the plain one
(tests/unit/test_pass_memo.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from localmodel.api import LocalModel
from localmodel.engines.pod import EnginePod
from localmodel.podspec import Manifest
from localmodel.render.applied import applied_objects, configmap_data
from localmodel.render.gateway import gateway_volumes
from localmodel.render.plan import RenderOptions, ReplicaPlan
from localmodel.render.pods import (
    Containers,
    build_containers,
    engine_pod,
    node_affinity,
    pod_spec_rest,
    pod_volumes,
    volume_names,
)
from localmodel.rules.evaluate import spec_key


def manifest_hash(obj: Mapping[str, Any]) -> str:
    """The digest the operator records on what it writes and compares to see
    whether an object is stale: of a pod's spec (`ANNOTATION_POD_SPEC_HASH`),
    of an applied ConfigMap or Service (`ANNOTATION_APPLIED_HASH`)."""
    return hashlib.sha256(_SORTED_JSON.encode(obj).encode()).hexdigest()[:16]


def pod_spec_hash(spec: Mapping[str, Any], known: Mapping[str, str]) -> str:
    """`manifest_hash(spec)`, with the JSON text of some top-level fields known
    already (``known``: field -> its `json.dumps(..., sort_keys=True)`): the same
    text, put together as the encoder writes an object (keys sorted, ", " and
    ": " between), so the same digest. The rest is encoded field by field with
    one kept encoder (`json.dumps` with an argument makes a new one per call)."""
    text = ", ".join(
        f"{_key_text(k)}: {known[k] if k in known else _value_text(spec[k])}"
        for k in sorted(spec.keys() | known.keys())
    )
    return hashlib.sha256(f"{{{text}}}".encode()).hexdigest()[:16]


def _key_text(key: str) -> str:
    """A key's JSON text; a pod spec's own keys are encoded once."""
    found = _KEY_TEXT.get(key)
    if found is None:  # (a pod spec has a handful of field names)
        found = _KEY_TEXT[key] = _SORTED_JSON.encode(key)
    return found


def _value_text(value: Any) -> str:
    """A value's JSON text (booleans without the encoder's general path)."""
    if value is True or value is False:
        return "true" if value else "false"
    return _SORTED_JSON.encode(value)


# What `json.dumps(obj, sort_keys=True)` encodes with (the same arguments).
_SORTED_JSON = json.JSONEncoder(sort_keys=True)
_KEY_TEXT: dict[str, str] = {}  # a key's JSON text, once encoded


class _TextTemplate:
    """The sorted JSON text of an object some of whose strings vary, put
    together around them: `fill(*values)` is `json.dumps(make(*values),
    sort_keys=True)` without encoding the rest again. ``make`` builds the
    object from ``arity`` strings; each may stand anywhere in a string, any
    number of times, or nowhere (a string's JSON text is its characters',
    each escaped alone). A value whose index is in ``raw`` stands, whole,
    for an object: it is given as that object's JSON text."""

    def __init__(self, make: Callable[..., Any], arity: int, raw: Sequence[int] = ()) -> None:
        marks = [_mark(i) for i in range(arity)]
        text = _SORTED_JSON.encode(make(*marks))
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
        encode, pieces = _SORTED_JSON.encode, self._pieces
        out = [pieces[0]]
        for k, (i, raw) in enumerate(self._slots):
            out.append(values[i] if raw else encode(values[i])[1:-1])
            out.append(pieces[k + 1])
        return "".join(out)


def _mark(i: int) -> str:
    """The string that stands for a template's value ``i`` (no name holds a NUL)."""
    return f"\x00{i}\x00"


_MARK = re.compile(r"\\u0000(\d+)\\u0000")  # `_mark`'s characters, escaped


_AFFINITY = _TextTemplate(node_affinity, 1)
_VOLUMES: dict[EnginePod, _TextTemplate] = {}  # by engine: its pods' volumes


def affinity_text(node: str) -> str:
    """`json.dumps(node_affinity(node), sort_keys=True)`, put together."""
    return _AFFINITY.fill(node)


def volumes_text(lm: LocalModel, r: ReplicaPlan) -> str:
    """The JSON text of a pod's volumes (`json.dumps(..., sort_keys=True)`), put together."""
    pod = engine_pod(lm)
    extra = gateway_volumes(lm)
    if extra:  # the API keys' Secret: such pods' volumes are encoded whole
        return json.dumps([*pod_volumes(pod, *volume_names(lm, r)), *extra], sort_keys=True)
    template = _VOLUMES.get(pod)
    if template is None:
        template = _VOLUMES[pod] = _TextTemplate(
            lambda c, m, k: pod_volumes(pod, c, m, k), 3
        )
    return template.fill(*volume_names(lm, r))


class PodParts:
    """What pods of alike models share, by value, for one pass: a pod's
    containers are a function of its spec as the rules read it
    (`rules.spec_key`: all but replicas, cpu and placement), its tuning and
    the options, so every pod with the same three gets the same container
    objects (manifests are never changed in place) and their JSON text, which
    `pod_spec_hash` reuses. Keep one per pass: the tuning is keyed by identity."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Hashable, int, RenderOptions], Containers] = {}

    def containers(
        self, lm: LocalModel, r: ReplicaPlan, options: RenderOptions, key: Hashable = None
    ) -> Containers:
        """``key``: the spec's `rules.spec_key`, when the caller has it."""
        memo = (spec_key(lm.spec) if key is None else key, id(r.tuning), options)
        found = self._seen.get(memo)
        if found is None or found.tuning is not r.tuning:
            inits, containers = build_containers(lm, r, options)
            found = self._seen[memo] = Containers(
                r.tuning,
                inits,
                containers,
                {
                    "initContainers": json.dumps(inits, sort_keys=True),
                    "containers": json.dumps(containers, sort_keys=True),
                },
            )
        return found


def pod_digest(lm: LocalModel, r: ReplicaPlan, parts: Containers,
               options: RenderOptions | None = None) -> str:
    """`manifest_hash(build_pod_spec(...))` without the spec: its containers'
    JSON text from ``parts``, its affinity's and volumes' put together around
    their names (what the operator compares with a pod's
    `ANNOTATION_POD_SPEC_HASH`; the manifest is made only for a pod to create)."""
    known = {**parts.json, "affinity": affinity_text(r.node), "volumes": volumes_text(lm, r)}
    return pod_spec_hash(pod_spec_rest(lm, options), known)


def applied_hashes(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], options: RenderOptions | None = None
) -> dict[tuple[str, str], str]:
    """(kind, name) -> `manifest_hash` of each of `applied_objects`: what a
    stored object's applied-hash annotation is compared with."""
    return {
        (m["kind"], m["metadata"]["name"]): manifest_hash(m)
        for m in applied_objects(lm, replicas, options=options)
    }


class AppliedDigests:
    """`applied_hashes` for one pass: alike models share a text template of
    each applied object (`_TextTemplate`), so a model's digests cost encoding
    its own strings, not its objects. Of a model, these objects read its
    spec (the key: `rules.spec_key`, all of it they read), its name,
    namespace and uid (the template's values, with the ConfigMap's data),
    whether it has a uid (offline renders have none) and whether a replica
    is placed (`test_pass_memo` holds the premise).
    Each template is checked against the plain digests of the model it is
    made from; one that differs is not used (the plain way, for every model
    of its key). Keep one per pass."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, list[_Applied] | None] = {}

    def __call__(
        self,
        lm: LocalModel,
        replicas: Sequence[ReplicaPlan],
        key: Hashable = None,
        options: RenderOptions | None = None,
    ) -> dict[tuple[str, str], str]:
        """``key``: the spec's `rules.spec_key`, when the caller has it."""
        options = options or RenderOptions()
        memo = (spec_key(lm.spec) if key is None else key, bool(lm.metadata.uid), bool(replicas),
                options)
        if memo not in self._seen:
            made = _applied_templates(lm, replicas, options)
            plain = applied_hashes(lm, replicas, options)
            self._seen[memo] = made if _fill(lm, replicas, made) == plain else None
            return plain
        templates = self._seen[memo]
        if templates is None:
            return applied_hashes(lm, replicas, options)
        return _fill(lm, replicas, templates)


class _Applied(NamedTuple):
    kind: str
    name: str  # with the marks of the model's name, namespace and uid
    text: _TextTemplate


_APPLIED_MARKS = tuple(_mark(i) for i in range(4))  # name, namespace, uid, data


def _applied_templates(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], options: RenderOptions
) -> list[_Applied]:
    """Text templates of `lm`'s applied objects, around its name, namespace,
    uid and the ConfigMap's data (its JSON text, `raw`)."""

    def marked(name: str, namespace: str, uid: str) -> LocalModel:
        meta = lm.metadata.model_copy(
            update={"name": name, "namespace": namespace, "uid": uid if lm.metadata.uid else ""}
        )
        return lm.model_copy(update={"metadata": meta})

    def make(i: int) -> Callable[..., Manifest]:
        def made(name: str, namespace: str, uid: str, data: str) -> Manifest:
            return applied_objects(
                marked(name, namespace, uid), replicas, data=data, options=options
            )[i]

        return made

    shapes = applied_objects(marked(*_APPLIED_MARKS[:3]), replicas, data={}, options=options)
    return [
        _Applied(m["kind"], m["metadata"]["name"], _TextTemplate(make(i), 4, raw=(3,)))
        for i, m in enumerate(shapes)
    ]


def _named(marked: str, values: Sequence[str]) -> str:
    for mark, value in zip(_APPLIED_MARKS[:3], values[:3], strict=True):
        marked = marked.replace(mark, value)
    return marked


def _fill(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], templates: Sequence[_Applied]
) -> dict[tuple[str, str], str]:
    meta = lm.metadata
    data = configmap_data(lm, sorted(replicas, key=lambda r: r.replica))
    values = (meta.name, meta.namespace, meta.uid or "", _SORTED_JSON.encode(data))
    return {
        (t.kind, _named(t.name, values)): hashlib.sha256(
            t.text.fill(*values).encode()
        ).hexdigest()[:16]
        for t in templates
    }
