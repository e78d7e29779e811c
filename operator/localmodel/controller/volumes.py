"""A PersistentVolume and the nodes it can be used from: its node affinity,
evaluated as the scheduler does. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from localmodel.controller.objects import Raw, metadata, section
from localmodel.facts import NodeFacts


@dataclass(frozen=True)
class Volume:
    """A PersistentVolume and the nodes it can be used from (None: any node)."""

    name: str
    terms: tuple[Raw, ...] | None


def volume(body: Raw) -> Volume:
    spec = section(body, "spec")
    affinity = spec.get("nodeAffinity")
    required = affinity.get("required") if isinstance(affinity, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    name = str(metadata(body).get("name") or "")
    if isinstance(terms, str) or not isinstance(terms, Sequence) or not terms:
        return Volume(name, None)
    return Volume(name, tuple(t for t in terms if isinstance(t, Mapping)))


def _expression_matches(expr: Raw, values_of: Mapping[str, str]) -> bool:
    key, op = str(expr.get("key", "")), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in values_of
    if op == "In":
        return present and values_of[key] in values
    if op == "NotIn":
        return not present or values_of[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(values_of[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def volume_reaches(vol: Volume, node: NodeFacts) -> bool:
    """Whether a pod on `node` can use the volume (its node affinity, as the
    scheduler evaluates it: terms ORed, expressions within a term ANDed)."""
    if vol.terms is None:
        return True
    fields = {"metadata.name": node.name}
    for term in vol.terms:
        exprs = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
        field_exprs = [e for e in term.get("matchFields") or [] if isinstance(e, Mapping)]
        if not exprs and not field_exprs:
            continue  # an empty term matches nothing
        if all(_expression_matches(e, node.labels) for e in exprs) and all(
            _expression_matches(e, fields) for e in field_exprs
        ):
            return True
    return False
