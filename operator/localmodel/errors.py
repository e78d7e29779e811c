"""Validation errors that carry their field, and the one way to print them.

Every check on a LocalModel (the pydantic types, the cross-field rules, the
semantic problems found before planning) reports a `FieldError`: the field
path, rooted at the object (`spec.kvCache`, `spec.placement.tolerations[0].effect`,
`metadata.name`), and the reason. `parse_local_model` turns *any* input into a
`LocalModel` or an `InvalidObject` holding every `FieldError` found; nothing
else escapes it. `format_errors` is the single formatter the CLI, the status
condition (`Valid=False`) and Events use, so one mistake reads the same
everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from localmodel.api import LocalModel

__all__ = ["FieldError", "InvalidObject", "format_errors", "join_path", "parse_local_model"]


class FieldError(ValueError):
    """One field is wrong: where (`field_path`) and why (`reason`).

    `field_path` is dotted with `[i]` list indexes and `[key]` map keys, rooted
    at the object; the empty path means the object itself (e.g. not a mapping),
    and then `str()` is just the reason.
    """

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(field_path, reason)
        self.field_path = field_path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.field_path}: {self.reason}" if self.field_path else self.reason

    def __repr__(self) -> str:
        return f"FieldError({self.field_path!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldError):
            return NotImplemented
        return (self.field_path, self.reason) == (other.field_path, other.reason)

    def __hash__(self) -> int:
        return hash((self.field_path, self.reason))

    def under(self, prefix: str) -> FieldError:
        """The same error, its path rooted one level up (`kvCache` under `spec`)."""
        return FieldError(join_path(prefix, self.field_path), self.reason)


class InvalidObject(ValueError):
    """An object that cannot be used, with every field error found in it."""

    def __init__(self, errors: Sequence[FieldError], *, kind: str, name: str) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        self.kind = kind
        self.name = name
        super().__init__(format_errors(self.errors, obj=f"{kind} {name}"))


def join_path(prefix: str, path: str) -> str:
    """`spec` + `kvCache` -> `spec.kvCache`; `spec.env` + `[0].name` -> `spec.env[0].name`."""
    if not prefix:
        return path
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def format_errors(
    errors: Sequence[FieldError], *, where: str | None = None, obj: str | None = None
) -> str:
    """One line per error: `<where>: <obj>: <field path>: <reason>`.

    `where` is the input (a file, `file[2]` for its third document,
    `file[0].items[3]`); `obj` the object (`LocalModel ai/qwen3`). Either may be
    left out: a status condition or an Event is already attached to its object,
    so it passes neither.
    """
    head = ": ".join(part for part in (where, obj) if part)
    lines = [f"{head}: {e}" if head else str(e) for e in errors]
    return "\n".join(dict.fromkeys(lines))  # once each, in order


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
        from localmodel.api.v1alpha1 import PATTERN_WORDS

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


def _without_nulls(body: Mapping[str, Any]) -> Mapping[str, Any]:
    out = {k: v for k, v in body.items() if v is not None}
    if isinstance(out.get("spec"), Mapping):
        out["spec"] = _drop_nulls(out["spec"])
    if isinstance(out.get("metadata"), Mapping):
        out["metadata"] = _meta_without_nulls(out["metadata"])
    return out


def parse_local_model(body: object) -> LocalModel:
    """A LocalModel from a manifest or an API server object, or InvalidObject.

    Accepts whatever YAML or JSON decoding produced; raises `InvalidObject`
    (never a TypeError, RecursionError or pydantic error) listing every field
    that is wrong, and the semantic checks that need the whole spec.
    """
    from localmodel.api import LocalModel

    name = object_name(body)
    if not isinstance(body, Mapping):
        got = "null" if body is None else type(body).__name__
        raise InvalidObject(
            [FieldError("", f"expected a LocalModel object (a mapping), got {got}")],
            kind="LocalModel",
            name=name,
        )
    try:
        return LocalModel.model_validate(_without_nulls(body))
    except ValidationError as e:
        raise InvalidObject(from_validation_error(e), kind="LocalModel", name=name) from None
    except FieldError as e:  # a rule that ran outside pydantic's wrapping
        raise InvalidObject([e], kind="LocalModel", name=name) from None
    except RecursionError:
        raise InvalidObject(
            [FieldError("", "nested too deeply")], kind="LocalModel", name=name
        ) from None
