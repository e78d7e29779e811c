"""A pod's digest from parts alike models share within a pass (`PodParts`),
the same digest as hashing the plain render's pod spec."""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from localmodel.api import LocalModel
from localmodel.engines.pod import EnginePod
from localmodel.incremental.keys import spec_key
from localmodel.incremental.templates import TextTemplate
from localmodel.podspec import Manifest
from localmodel.render.digests import SORTED_JSON, text_digest
from localmodel.render.gateway import gateway_volumes
from localmodel.render.plan import RenderOptions, ReplicaPlan
from localmodel.render.pods import (
    build_containers,
    engine_pod,
    node_affinity,
    pod_spec_rest,
    pod_volumes,
    volume_names,
)
from localmodel.rules.model import Tuning


@dataclass(frozen=True)
class Containers:
    """Keeps a pod's containers as `PodParts` shares them: the objects and their JSON text."""

    tuning: Tuning  # held: its id is part of the key
    inits: list[Manifest]
    containers: list[Manifest]
    json: dict[str, str]  # field -> its JSON text, for the pod spec's hash


class PodParts:
    """Keeps a pod's containers and their JSON text for one pass, keyed on (spec
    as the pass reads it (`incremental.keys.spec_key`), tuning, options).

    Saves the render step's `render.build_containers` (and encoding its
    result) for every pod but the first of its key: a pod's containers read
    neither the model's name nor the replica's node, so every pod with the
    same three gets the same container objects (manifests are never changed in
    place) and their JSON text, which `pod_spec_hash` reuses. Keep one per
    pass: the tuning is keyed by identity. Held equal to the plain render by
    tests/controller/test_pass_memo.py (`test_a_pods_containers_read_neither_its_name_nor_its_node`,
    `test_the_pod_digest_from_shared_parts_is_the_manifest_hash`)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Hashable, int, RenderOptions], Containers] = {}

    def containers(
        self, lm: LocalModel, r: ReplicaPlan, options: RenderOptions, key: Hashable = None
    ) -> Containers:
        """``key``: the spec's `spec_key`, when the caller has it."""
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
    return text_digest(f"{{{text}}}")


def _key_text(key: str) -> str:
    """A key's JSON text; a pod spec's own keys are encoded once."""
    found = _KEY_TEXT.get(key)
    if found is None:  # (a pod spec has a handful of field names)
        found = _KEY_TEXT[key] = SORTED_JSON.encode(key)
    return found


def _value_text(value: Any) -> str:
    """A value's JSON text (booleans without the encoder's general path)."""
    if value is True or value is False:
        return "true" if value else "false"
    return SORTED_JSON.encode(value)


_KEY_TEXT: dict[str, str] = {}  # a key's JSON text, once encoded
_AFFINITY = TextTemplate(node_affinity, 1)
_VOLUMES: dict[EnginePod, TextTemplate] = {}  # by engine: its pods' volumes


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
        template = _VOLUMES[pod] = TextTemplate(
            lambda c, m, k: pod_volumes(pod, c, m, k), 3
        )
    return template.fill(*volume_names(lm, r))
