"""The digests the operator records on what it writes and compares to see
whether an object is stale, the plain way: an object's sorted JSON text,
hashed. The pass's shortcuts to the same digests (`PodParts`,
`AppliedDigests`) are memo layers: localmodel/incremental/."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from localmodel.api import LocalModel
from localmodel.render.applied import applied_objects
from localmodel.render.plan import RenderOptions, ReplicaPlan

# What `json.dumps(obj, sort_keys=True)` encodes with (the same arguments): the
# digests' text, which the memo layers put together piece by piece.
SORTED_JSON = json.JSONEncoder(sort_keys=True)


def text_digest(text: str) -> str:
    """The digest of an object's sorted JSON text (`SORTED_JSON`'s)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def manifest_hash(obj: Mapping[str, Any]) -> str:
    """The digest the operator records on what it writes and compares to see
    whether an object is stale: of a pod's spec (`ANNOTATION_POD_SPEC_HASH`),
    of an applied ConfigMap or Service (`ANNOTATION_APPLIED_HASH`)."""
    return text_digest(SORTED_JSON.encode(obj))


def applied_hashes(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], options: RenderOptions | None = None
) -> dict[tuple[str, str], str]:
    """(kind, name) -> `manifest_hash` of each of `applied_objects`: what a
    stored object's applied-hash annotation is compared with."""
    return {
        (m["kind"], m["metadata"]["name"]): manifest_hash(m)
        for m in applied_objects(lm, replicas, options=options)
    }
