"""Field checks declared once, enforced twice: by Python and by the API server.

Each declaration here yields both halves of one check: the Python validator the
CLI and operator run (`localmodel.api.parse_local_model`), and the OpenAPI
keywords / CEL rule the generated CRD carries, with the same message. So the
API server refuses exactly what the operator cannot use, and offline `render`
says the same as the cluster.

- `QuantityRange`: a Kubernetes quantity with limits. The syntax is a strict
  subset of apimachinery's (`pattern`), the limits are checked in CEL with the
  Kubernetes quantity library (`isQuantity`, `quantity(...).compareTo`), and in
  Python with the exact parser in `localmodel.facts.quantity`.
- `NameFormat`: the Kubernetes name grammars (DNS-1035 label, DNS-1123 label and
  subdomain, qualified name = label key, label value), as a regex plus length
  limits that read the same in Python `re` and CEL's RE2.
- `go_duration_ns`: a Go duration (`GO_DURATION_PATTERN`) read as Go's
  `time.ParseDuration`, and so CEL's `duration()`, reads it: a rule that bounds
  one compares the same number in both halves.
- `CrossFieldRule`: a rule over several fields of one object, as a CEL
  expression the API server enforces *and* a Python check the CLI and operator
  enforce (`enforce`), with one message for both; `rules_cel` writes a set of
  them into the CRD. The rules themselves are the API's (`localmodel.api.rules`).

`ApiModel` is the base of every API model (camelCase names, strict, frozen).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictBool,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from localmodel.errors import FieldError
from localmodel.facts.quantity import parse_quantity

__all__ = [
    "DNS1035_LABEL",
    "DNS1123_LABEL",
    "DNS1123_SUBDOMAIN",
    "GO_DURATION_MAX_LENGTH",
    "GO_DURATION_PATTERN",
    "LABEL_VALUE",
    "QUALIFIED_NAME",
    "ApiModel",
    "Boolean",
    "CrossFieldRule",
    "Integer",
    "KeysOf",
    "NameFormat",
    "Number",
    "QuantityRange",
    "cel_string",
    "enforce",
    "go_duration_ns",
    "rules_cel",
]


def cel_string(text: str) -> str:
    """A CEL string literal (single-quoted, backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Check:
    """A pydantic `Annotated` marker: Python check after the type, and its CRD keywords.

    `Annotated[str, DECLARATION]` is all a model field needs.
    """

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = dict(handler(schema))
        out.update(self.schema())
        return out


# ---- numbers and booleans, as the API server reads them ----------------------------------


def _integer(value: Any) -> Any:
    """What a CRD `type: integer` accepts: a JSON integer, or a number with no fraction.

    The API server stores `2.0` as 2 and refuses `"2"`, `true` and `2.5`; so does this.
    """
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise ValueError(f"must be an integer, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    names = {
        str: "a string",
        float: "a fraction",
        int: "an integer",
        bool: "a boolean",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }
    return names.get(type(value), f"a {type(value).__name__}")


def _number(value: Any) -> Any:
    """What `type: number` accepts: an integer or a finite fraction; not "5", not true."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, not {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"must be a boolean (true or false), not {_kind(value)}")
    return value


# `type: integer` / `type: boolean` fields: no coercion of "2", "yes" or 1.
Integer = Annotated[int, BeforeValidator(_integer)]
Number = Annotated[float, BeforeValidator(_number)]
Boolean = Annotated[StrictBool, BeforeValidator(_boolean)]


# ---- quantities -------------------------------------------------------------------------

# A strict subset of apimachinery's quantity grammar: no sign, no bare "." forms, only the
# suffixes a memory or disk size uses. Anything this accepts, `isQuantity` accepts too.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
# Long enough for any sensible size, short enough to bound CEL's cost estimate.
QUANTITY_MAX_LENGTH = 32


@dataclass(frozen=True)
class QuantityRange(_Check):
    """A size in bytes between `minimum` and `maximum` (quantities, inclusive).

    `keyword` is a literal allowed instead of a quantity (`auto`).
    """

    minimum: str
    maximum: str
    keyword: str | None = None
    example: str = "8Gi"
    _bounds: tuple[Fraction, Fraction] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_bounds", (parse_quantity(self.minimum), parse_quantity(self.maximum))
        )

    @property
    def message(self) -> str:
        alt = f"`{self.keyword}` or " if self.keyword else ""
        return (
            f"must be {alt}a quantity from {self.minimum} to {self.maximum} "
            f"(e.g. {self.example}; suffixes Ki Mi Gi Ti Pi Ei, k M G T P E, or e<n>)"
        )

    @property
    def pattern(self) -> str:
        return (f"^{self.keyword}$|" if self.keyword else "") + QUANTITY_PATTERN

    @property
    def cel(self) -> str:
        q, lo, hi = "quantity(self)", cel_string(self.minimum), cel_string(self.maximum)
        rule = (
            f"isQuantity(self) && {q}.compareTo(quantity({lo})) >= 0 "
            f"&& {q}.compareTo(quantity({hi})) <= 0"
        )
        return f"self == {cel_string(self.keyword)} || ({rule})" if self.keyword else rule

    def valid(self, value: str) -> bool:
        if self.keyword is not None and value == self.keyword:
            return True
        if len(value) > QUANTITY_MAX_LENGTH or not _QUANTITY_RE.fullmatch(value):
            return False
        try:
            amount = parse_quantity(value)
        except ValueError:  # an exponent beyond any limit
            return False
        lo, hi = self._bounds
        return lo <= amount <= hi

    def check(self, value: str) -> str:
        if not self.valid(value):
            raise ValueError(self.message)
        return value

    def schema(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "maxLength": QUANTITY_MAX_LENGTH,
            "x-kubernetes-validations": [{"rule": self.cel, "message": self.message}],
        }


# ---- durations ---------------------------------------------------------------------------

# A positive Go duration ("30m", "1h30m", "90s"): what CEL's duration() and Go's
# time.ParseDuration read; no sign, no bare number (a unit says what it counts).
GO_DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
GO_DURATION_MAX_LENGTH = 32
_UNIT_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
            "h": 3600 * 10**9}
_PART = re.compile(r"([0-9]+)(?:\.([0-9]+))?(ns|us|ms|s|m|h)")
_MAX_NS = 1 << 63


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's `leadingFraction`: the digits it keeps before they would overflow, and
    their scale (later digits are dropped, not rounded)."""
    x, scale = 0, 1.0
    for c in digits:
        if x > ((1 << 63) - 1) // 10:
            break
        y = x * 10 + int(c)
        if y > _MAX_NS:
            break
        x, scale = y, scale * 10
    return x, scale


def go_duration_ns(text: str) -> int | None:
    """Nanoseconds of a positive Go duration as Go's time.ParseDuration (and so
    CEL's `duration()`) reads it, rounding a fraction down per part as it does;
    None where it refuses the text (a shape `GO_DURATION_PATTERN` refuses, or
    more than about 292 years)."""
    if len(text) > GO_DURATION_MAX_LENGTH or not re.fullmatch(GO_DURATION_PATTERN, text):
        return None
    total = 0
    for whole, fraction, unit in _PART.findall(text):
        ns, v = _UNIT_NS[unit], int(whole)
        if v > _MAX_NS // ns:
            return None
        v *= ns
        f, scale = _leading_fraction(fraction)
        if f > 0:
            v += int(float(f) * (float(ns) / scale))
        total += v
        if v > _MAX_NS or total > _MAX_NS:
            return None
    return total if total <= _MAX_NS - 1 else None


# ---- names ------------------------------------------------------------------------------

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"  # a qualified name's name part


@dataclass(frozen=True)
class NameFormat(_Check):
    """One of Kubernetes' name grammars: a regex, a length limit, a prefix limit.

    `prefix_max` is for qualified names: the part before `/` (a DNS subdomain)
    may be at most that long.
    """

    title: str
    regex: str  # without anchors; the same text in Python re and RE2
    max_length: int
    prefix_max: int | None = None
    allow_empty: bool = False

    @property
    def message(self) -> str:
        what = {
            "DNS-1035 label": "lower-case letters, digits and '-', starting with a letter and "
            "ending with a letter or digit",
            "DNS-1123 label": "lower-case letters, digits and '-', starting and ending with a "
            "letter or digit",
            "DNS-1123 subdomain": "DNS-1123 labels joined by '.'",
            "qualified name": "an optional DNS subdomain prefix and '/', then letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit",
            "label value": "letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit",
        }[self.title]
        empty = ", or empty" if self.allow_empty else ""
        prefix = f" (prefix at most {self.prefix_max})" if self.prefix_max else ""
        return (
            f"must be a {self.title}: {what}, at most {self.max_length} characters{prefix}{empty}"
        )

    @property
    def pattern(self) -> str:
        body = f"^({self.regex})$"
        return f"^$|{body}" if self.allow_empty else body

    def valid(self, value: str) -> bool:
        if value == "":
            return self.allow_empty
        if len(value) > self.max_length or not re.fullmatch(self.regex, value):
            return False
        return self.prefix_max is None or value.find("/") <= self.prefix_max

    def cel(self, expr: str = "self") -> str:
        """A CEL boolean: `expr` (a string) is valid."""
        rule = f"{expr}.size() <= {self.max_length} && {expr}.matches({cel_string(self.pattern)})"
        if self.prefix_max is not None:
            rule += f" && {expr}.indexOf('/') <= {self.prefix_max}"
        return rule

    def check(self, value: str) -> str:
        if not self.valid(value):
            raise ValueError(self.message)
        return value

    def schema(self) -> dict[str, Any]:
        """OpenAPI keywords for a string field (a prefix limit needs CEL)."""
        out: dict[str, Any] = {"pattern": self.pattern, "maxLength": self.max_length}
        if self.prefix_max is not None:
            out["x-kubernetes-validations"] = [
                {
                    "rule": "self == '' || " + self.cel() if self.allow_empty else self.cel(),
                    "message": self.message,
                }
            ]
        return out

    @property
    def keys(self) -> KeysOf:
        """The same format for the keys of a map."""
        return KeysOf(self)


@dataclass(frozen=True)
class KeysOf(_Check):
    """Every key of a map has `format` (a map's keys have no OpenAPI pattern: CEL)."""

    format: NameFormat

    @property
    def message(self) -> str:
        return f"every key {self.format.message}"

    def check(self, value: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in value if not self.format.valid(k)]
        if bad:
            raise ValueError(f"key {bad[0]!r}: {self.format.message}")
        return value

    def schema(self) -> dict[str, Any]:
        rule = f"self.all(k, {self.format.cel('k')})"
        return {"x-kubernetes-validations": [{"rule": rule, "message": self.message}]}


DNS1035_LABEL = NameFormat("DNS-1035 label", r"[a-z]([-a-z0-9]*[a-z0-9])?", 63)
DNS1123_LABEL = NameFormat("DNS-1123 label", _LABEL, 63)
DNS1123_SUBDOMAIN = NameFormat("DNS-1123 subdomain", rf"{_LABEL}(\.{_LABEL})*", 253)
QUALIFIED_NAME = NameFormat(
    "qualified name", rf"({_LABEL}(\.{_LABEL})*/)?{_NAME}", 253 + 1 + 63, prefix_max=253
)
LABEL_VALUE = NameFormat("label value", _NAME, 63, allow_empty=True)


# ---- models and cross-field rules ---------------------------------------------------------


class ApiModel(BaseModel):
    """The base of every API model: camelCase names, unknown fields refused, frozen."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        frozen=True,
    )


_M = TypeVar("_M")


def one_default(cls: Callable[[], _M]) -> Callable[[], _M]:
    """A `default_factory` that gives every object leaving the part out one
    instance (API models are frozen): at 5 000 models, each its own default
    `Gateway`, `Storage`, `Placement` and `EngineSpec` held memory for nothing
    (docs/benchmarks.md, issue 33)."""
    made: list[_M] = []

    def default() -> _M:
        if not made:
            made.append(cls())
        return made[0]

    return default


@dataclass(frozen=True)
class CrossFieldRule:
    """One validation rule, enforced by the API server (CEL) and by Python alike."""

    cel: str
    message: str
    check: Callable[[Any], bool]  # True when the object is valid
    field_path: str  # where to point the user, relative to the object the rule sits on


_T = TypeVar("_T")


def enforce(rules: tuple[CrossFieldRule, ...], obj: _T) -> _T:
    """Python's half of the cross-field rules: the first broken one raises.

    The FieldError's path is relative to the object the rules sit on; the
    caller (`localmodel.api.parse_local_model`) roots it.
    """
    for rule in rules:
        if not rule.check(obj):
            raise FieldError(rule.field_path, rule.message)
    return obj


def rules_cel(rules: tuple[CrossFieldRule, ...]) -> list[dict[str, str]]:
    """CEL validations for the CRD, from the same rules Python enforces."""
    out = []
    for r in rules:
        entry = {"rule": r.cel, "message": r.message}
        # Point the API server's error at the offending field.
        if re.fullmatch(r"[A-Za-z]+", r.field_path):
            entry["fieldPath"] = f".{r.field_path}"
        out.append(entry)
    return out
