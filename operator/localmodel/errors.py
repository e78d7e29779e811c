"""Validation errors that carry their field, and the one way to print them.

Every check on a LocalModel (the pydantic types, the cross-field rules, the
semantic problems found before planning) reports a `FieldError`: the field
path, rooted at the object (`spec.kvCache`, `spec.placement.tolerations[0].effect`,
`metadata.name`), and the reason. `localmodel.api.parse_local_model` turns
*any* input into a `LocalModel` or an `InvalidObject` holding every
`FieldError` found; nothing else escapes it. `format_errors` is the single
formatter the CLI, the status condition (`Valid=False`) and Events use, so one
mistake reads the same everywhere. This module imports nothing of the API.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FieldError", "InvalidObject", "format_errors", "join_path"]


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
