"""Kubernetes resource quantities ("3500m", "4", "128Gi", "1e3", "1.5G"), parsed exactly.

The grammar is the one in k8s.io/apimachinery `resource.Quantity`:

    <quantity> ::= <sign><number><suffix>
    <number>   ::= digits | digits.digits | digits. | .digits
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei        (binary)
                 | n | u | m | "" | k | M | G | T | P | E    (decimal)
                 | e<signed int> | E<signed int>     (decimal exponent)

Values are computed with `fractions.Fraction`, never floats, so "0.1" CPU is
exactly 100m. Like Kubernetes (`Quantity.MilliValue()` / `Value()`), a value that
is not a whole number of the target unit is rounded *up*: "0.0001" CPU is 1m,
"0.5" bytes is 1 byte. Negative quantities are rejected: no node budget or
container request can be negative.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

__all__ = ["format_bytes", "parse_bytes", "parse_cpu_milli", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    # n and u are missing from the grammar comment in quantity.go but parsed by
    # it (suffix.go), and metrics-server reports CPU usage in n ("2629548n").
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The exponent form is tried first so "1E3" is 1000, while a bare "1E" is one exa.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exp>[+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
)
# Kubernetes stores quantities as int64 scaled values; anything beyond that is a
# typo, and a huge exponent ("1e999999999") must not make us build a giant integer.
_MAX_EXPONENT = 30
_INT64_MAX = 2**63 - 1
_MI = 2**20


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity, in base units (CPUs, bytes).

    Raises ValueError naming the value when it is not a non-negative quantity.
    """
    if isinstance(value, bool):  # bool is an int: `cpu: true` is a mistake, not 1
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        result = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a quantity")
        # repr() is the shortest decimal that reads back as this float: YAML's
        # `cpu: 0.1` means 0.1 exactly, not 0.1000000000000000055...
        result = Fraction(Decimal(repr(value)))
    elif isinstance(value, str):
        result = _parse_text(value)
    else:
        raise ValueError(f"{value!r} is not a quantity (expected a string or a number)")
    if result < 0:
        raise ValueError(f"{value!r} is negative")
    return result


def _parse_text(text: str) -> Fraction:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity (examples: 500m, 2, 1.5, 128Gi, 1e3)")
    number = Fraction(Decimal(match["number"]))
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{text!r} is out of range (exponent beyond ±{_MAX_EXPONENT})")
        scaled = number * Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        scaled = number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])
    if match["sign"] == "-":
        scaled = -scaled
    return scaled


def _whole(value: str | int | float, scaled: Fraction, unit: str) -> int:
    result = math.ceil(scaled)
    if result > _INT64_MAX:
        raise ValueError(f"{value!r} is out of range (more than 2^63-1 {unit})")
    return result


def parse_cpu_milli(value: str | int | float) -> int:
    """A CPU quantity in millicores: "3500m" -> 3500, "4" -> 4000, 0.5 -> 500.

    Fractions of a millicore round up, as Kubernetes does ("0.0001" -> 1).
    """
    return _whole(value, parse_quantity(value) * 1000, "millicores")


def parse_bytes(value: str | int | float) -> int:
    """A memory quantity in bytes: "128Gi", "131072Ki", "500M", "1.5G", 1024.

    Fractions of a byte round up, as Kubernetes does ("500m" -> 1).
    """
    return _whole(value, parse_quantity(value), "bytes")


def format_bytes(n: int) -> str:
    """A canonical binary quantity for ``n`` bytes, rounded *up* to a whole Mi.

    The largest binary suffix that divides it exactly is used: 5 GiB -> "5Gi",
    5325 MiB -> "5325Mi", one byte -> "1Mi", zero -> "0". Rounding up means a
    memory request built from it is never smaller than the computed need.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"{n!r} is not a whole number of bytes")
    if n < 0:
        raise ValueError(f"{n!r} is negative")
    if n == 0:
        return "0"
    amount = -(-n // _MI)  # ceil
    suffix = "Mi"
    for bigger in ("Gi", "Ti", "Pi", "Ei"):
        if amount % 1024:
            break
        amount //= 1024
        suffix = bigger
    return f"{amount}{suffix}"
