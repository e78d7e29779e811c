"""The applied objects' digests from text templates alike models share within
a pass (`AppliedDigests`), the same digests as `render.applied_hashes`."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from localmodel.api import LocalModel
from localmodel.incremental.keys import spec_key
from localmodel.incremental.templates import TextTemplate, mark
from localmodel.podspec import Manifest
from localmodel.render.applied import applied_objects, configmap_data
from localmodel.render.digests import SORTED_JSON, applied_hashes, text_digest
from localmodel.render.plan import RenderOptions, ReplicaPlan


class AppliedDigests:
    """Keeps a text template of each applied object for one pass, keyed on (spec
    as the pass reads it (`incremental.keys.spec_key`), has a uid, has a
    placed replica, options).

    Saves the render step's `render.applied_hashes` (rendering and encoding
    each applied object) for every model but the first of its key: of a model,
    these objects read its spec as the key does, its name, namespace and uid
    (the template's values, with the ConfigMap's data), whether it has a uid
    (offline renders have none) and whether a replica is placed. Each template
    is checked against the plain digests of the model it is made from; one
    that differs is not used (the plain way, for every model of its key).
    Keep one per pass. Held equal to the plain digests by
    tests/controller/test_pass_memo.py
    (`test_applied_digests_from_a_shared_template_are_the_manifest_hashes`)."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, list[_Applied] | None] = {}

    def __call__(
        self,
        lm: LocalModel,
        replicas: Sequence[ReplicaPlan],
        key: Hashable = None,
        options: RenderOptions | None = None,
    ) -> dict[tuple[str, str], str]:
        """``key``: the spec's `spec_key`, when the caller has it."""
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
    """One applied object's kind, marked name and text template."""

    kind: str
    name: str  # with the marks of the model's name, namespace and uid
    text: TextTemplate


_APPLIED_MARKS = tuple(mark(i) for i in range(4))  # name, namespace, uid, data


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
        _Applied(m["kind"], m["metadata"]["name"], TextTemplate(make(i), 4, raw=(3,)))
        for i, m in enumerate(shapes)
    ]


def _named(marked: str, values: Sequence[str]) -> str:
    for one, value in zip(_APPLIED_MARKS[:3], values[:3], strict=True):
        marked = marked.replace(one, value)
    return marked


def _fill(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], templates: Sequence[_Applied]
) -> dict[tuple[str, str], str]:
    meta = lm.metadata
    data = configmap_data(lm, sorted(replicas, key=lambda r: r.replica))
    values = (meta.name, meta.namespace, meta.uid or "", SORTED_JSON.encode(data))
    return {
        (t.kind, _named(t.name, values)): text_digest(t.text.fill(*values)) for t in templates
    }
