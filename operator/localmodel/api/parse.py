"""Any input -> a `LocalModel`, or an `InvalidObject` with every field error.

`parse_local_model` accepts whatever YAML or JSON decoding produced (or what an
API server returned) and turns pydantic's errors into `FieldError`s rooted at
the object, with the pattern words of `spec.PATTERN_WORDS` rather than
regexes. It lives beside the models it validates; `localmodel.errors` holds the
error types and their one formatter and imports nothing of the API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from localmodel.api.localmodel import LocalModel
from localmodel.api.model_info import ModelInfo
from localmodel.api.shared import Shared
from localmodel.api.spec import (
    GGUF,
    PATTERN_WORDS,
    EngineSpec,
    Gateway,
    Placement,
    Storage,
)
from localmodel.api.status import Condition, DecisionStatus, LocalModelStatus
from localmodel.errors import FieldError, InvalidObject, join_path

__all__ = ["CONDITIONS", "DECISIONS", "from_validation_error", "object_name",
           "parse_local_model", "parse_status"]

# Parts that repeat across models, each validated once while in use
# (`shared.py`); none reads its parent or a validation context.
_SPEC_PARTS: dict[str, Shared[Any]] = {
    "engine": Shared(EngineSpec), "placement": Shared(Placement), "storage": Shared(Storage),
    "gateway": Shared(Gateway), "gguf": Shared(GGUF), "modelInfo": Shared(ModelInfo)}
# A status's conditions and rule texts: the same in many models, and the same
# objects in a model's stored status and the one the operator works out for it.
CONDITIONS: Shared[Condition] = Shared(Condition)
DECISIONS: Shared[DecisionStatus] = Shared(DecisionStatus)


# pydantic names union branches and validator wrappers in `loc`; a user never wrote them.
_BRANCH_TAGS = ("int", "str", "bool", "float", "literal[", "constrained-", "function-")


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(_BRANCH_TAGS):
            continue
        else:
            out = join_path(out, part)
    return out


def _reason(err: Mapping[str, Any]) -> tuple[str, str]:
    """(extra path below loc, reason) of one pydantic error."""
    ctx = err.get("ctx") or {}
    raised = ctx.get("error")
    if isinstance(raised, FieldError):
        return raised.field_path, raised.reason
    if err.get("type") == "string_pattern_mismatch":
        words = PATTERN_WORDS.get(str(ctx.get("pattern")))
        if words is not None:
            return "", f"must be {words}; got {_shown(err.get('input'))}"
    msg = str(err.get("msg", "invalid"))
    return "", msg.removeprefix("Value error, ")


def _shown(value: object, limit: int = 60) -> str:
    """A value quoted for a message, cut short: input may be long or hostile."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def from_validation_error(e: ValidationError) -> tuple[FieldError, ...]:
    """Every error pydantic found, as FieldErrors rooted where validation started."""
    out: list[FieldError] = []
    for err in e.errors(include_url=False):
        extra, reason = _reason(err)
        out.append(FieldError(join_path(_path(err["loc"]), extra), reason))
    return tuple(dict.fromkeys(out))


def object_name(body: object) -> str:
    """`namespace/name`, `name`, or `?`: for messages, from whatever the body holds."""
    meta = body.get("metadata") if isinstance(body, Mapping) else None
    if not isinstance(meta, Mapping):
        return "?"
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return "?"
    return f"{ns}/{name}" if isinstance(ns, str) and ns else name


def _drop_nulls(value: object, depth: int = 0) -> object:
    """The object as the API server stores it: a null in a field the schema does
    not mark nullable (none of ours is) is pruned before defaulting, so the
    field's default applies, as if it were absent."""
    if depth > 200:  # deeper than any valid spec; let validation say what is wrong
        return value
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v, depth + 1) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v, depth + 1) for v in value]
    return value


def _meta_without_nulls(meta: Mapping[str, Any]) -> dict[str, Any]:
    """ObjectMeta as the API server decodes it: a null field is its zero value
    (absent), and a null label or annotation value is the empty string."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if v is None:
            continue
        if k in ("labels", "annotations") and isinstance(v, Mapping):
            v = {key: "" if val is None else val for key, val in v.items()}
        out[k] = v
    return out


def _without_nulls(body: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if v is not None}
    if isinstance(out.get("spec"), Mapping):
        out["spec"] = _drop_nulls(out["spec"])
    if isinstance(out.get("metadata"), Mapping):
        out["metadata"] = _meta_without_nulls(out["metadata"])
    return out


def parse_local_model(body: object, status: LocalModelStatus | None = None) -> LocalModel:
    """A LocalModel from a manifest or an API server object, or InvalidObject.

    Accepts whatever YAML or JSON decoding produced; raises `InvalidObject`
    (never a TypeError, RecursionError or pydantic error) listing every field
    that is wrong, and the semantic checks that need the whole spec.
    `status`: one already parsed (`parse_status`), held as it is.
    """
    name = object_name(body)
    if not isinstance(body, Mapping):
        got = "null" if body is None else type(body).__name__
        raise InvalidObject(
            [FieldError("", f"expected a LocalModel object (a mapping), got {got}")],
            kind="LocalModel",
            name=name,
        )
    data = _without_nulls(body)
    spec = data.get("spec")
    if isinstance(spec, dict):
        for field, parts in _SPEC_PARTS.items():
            if field in spec:
                spec[field] = parts.part(spec[field])
    if status is not None:
        data["status"] = status
    try:
        return LocalModel.model_validate(data)
    except ValidationError as e:
        raise InvalidObject(from_validation_error(e), kind="LocalModel", name=name) from None
    except FieldError as e:  # a rule that ran outside pydantic's wrapping
        raise InvalidObject([e], kind="LocalModel", name=name) from None
    except RecursionError:
        raise InvalidObject(
            [FieldError("", "nested too deeply")], kind="LocalModel", name=name
        ) from None


def parse_status(raw: Mapping[str, Any]) -> LocalModelStatus:
    """A stored status, tolerantly (fields others wrote are ignored); raises
    `ValidationError`. Its conditions and each placement's decisions are the
    shared ones (`CONDITIONS`, `DECISIONS`)."""
    data = dict(raw)
    conditions = data.get("conditions")
    if isinstance(conditions, list | tuple):
        data["conditions"] = [CONDITIONS.part(c) for c in conditions]
    placements = data.get("placements")
    if isinstance(placements, list | tuple):
        data["placements"] = [_with_shared_decisions(p) for p in placements]
    return LocalModelStatus.model_validate(data)


def _with_shared_decisions(placement: object) -> object:
    if not isinstance(placement, Mapping):
        return placement
    decisions = placement.get("decisions")
    if not isinstance(decisions, list | tuple):
        return placement
    return {**placement, "decisions": [DECISIONS.part(d) for d in decisions]}
