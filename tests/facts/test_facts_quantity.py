"""Kubernetes quantities parse exactly, round up like Kubernetes, and format canonically."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.facts.quantity import format_bytes, parse_bytes, parse_cpu_milli

pytestmark = pytest.mark.unit

Ki, Mi, Gi, Ti = 2**10, 2**20, 2**30, 2**40


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("3500m", 3500),
        ("4", 4000),
        ("0.5", 500),
        ("0.1", 100),  # exact decimal, no float error
        ("1.5", 1500),
        (".5", 500),
        ("2.", 2000),
        ("+2", 2000),
        ("0", 0),
        ("1e3", 1_000_000),
        ("1E3", 1_000_000),
        ("1e-3", 1),
        ("15e-1", 1500),
        ("1k", 1_000_000),
        ("100m", 100),
        ("0.0001", 1),  # below a millicore rounds up, as Kubernetes does
        ("2629548n", 3),  # metrics-server style: 2.629548m rounds up
        ("1500u", 2),
        ("1000000n", 1),
        ("1.0001", 1001),  # 1000.1m rounds up to 1001m
        (4, 4000),
        (0.5, 500),
        (0.1, 100),  # YAML float 0.1 means 0.1
        (2.0, 2000),
    ],
)
def test_parse_cpu_milli_table(text: str | int | float, milli: int) -> None:
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("128Gi", 128 * Gi),
        ("131072Ki", 128 * Mi),
        ("500M", 500_000_000),
        ("1.5G", 1_500_000_000),
        ("1.5Gi", 3 * Gi // 2),
        ("1e3", 1000),
        ("1E", 10**18),  # a bare E is the exa suffix, not an exponent
        ("1Ei", 2**60),
        ("2Ti", 2 * Ti),
        ("1k", 1000),
        ("0.5Ki", 512),
        ("500m", 1),  # half a byte rounds up
        ("1", 1),
        (1024, 1024),
        ("16Gi", 16 * Gi),
    ],
)
def test_parse_bytes_table(text: str | int, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    "bad",
    [
        "abc",
        "",
        " 4",
        "4 ",
        "1.2.3",
        "1KB",
        "1ki",
        "1K",
        "Gi",
        "1e",
        "e3",
        "--1",
        "1Gi1",
        "-1",
        "-500m",
        "1e999999",
        "1e31",
        "0x10",
        "1_000",
        "∞",
        True,
        None,
        [],
        float("nan"),
        float("inf"),
        -1,
    ],
)
def test_invalid_quantities_raise_value_error_naming_the_value(bad: object) -> None:
    for parse in (parse_cpu_milli, parse_bytes):
        with pytest.raises(ValueError) as excinfo:
            parse(bad)  # type: ignore[arg-type]
        assert repr(bad) in str(excinfo.value)


def test_values_beyond_int64_are_rejected() -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_bytes("8Ei")  # 2^63
    assert parse_bytes("7Ei") == 7 * 2**60
    with pytest.raises(ValueError, match="out of range"):
        parse_cpu_milli("1E")  # 10^21 millicores


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0"),
        (1, "1Mi"),
        (Mi, "1Mi"),
        (Mi + 1, "2Mi"),
        (5 * Gi, "5Gi"),
        (5325 * Mi, "5325Mi"),
        (5325 * Mi - 1, "5325Mi"),
        (1024 * Gi, "1Ti"),
        (1536 * Mi, "1536Mi"),
        (2**60, "1Ei"),
        (2048 * 2**60, "2048Ei"),
    ],
)
def test_format_bytes_rounds_up_to_mi_and_uses_the_largest_exact_suffix(
    size: int, text: str
) -> None:
    assert format_bytes(size) == text


@pytest.mark.parametrize("bad", [-1, 1.5, "5Gi", True])
def test_format_bytes_rejects_non_byte_counts(bad: object) -> None:
    with pytest.raises(ValueError):
        format_bytes(bad)  # type: ignore[arg-type]


sizes = st.integers(min_value=0, max_value=2**62)


@settings(max_examples=200, deadline=None)
@given(sizes)
def test_format_bytes_never_rounds_down_and_adds_less_than_a_mi(n: int) -> None:
    parsed = parse_bytes(format_bytes(n))
    assert n <= parsed < n + Mi


@settings(max_examples=200, deadline=None)
@given(sizes)
def test_format_bytes_is_a_fixed_point_after_one_round_trip(n: int) -> None:
    text = format_bytes(n)
    assert format_bytes(parse_bytes(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**40))
def test_whole_mi_sizes_round_trip_exactly(mib: int) -> None:
    assert parse_bytes(format_bytes(mib * Mi)) == mib * Mi


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**12))
def test_millicore_strings_round_trip(milli: int) -> None:
    assert parse_cpu_milli(f"{milli}m") == milli
    if milli % 1000 == 0:
        assert parse_cpu_milli(str(milli // 1000)) == milli


@settings(max_examples=200, deadline=None)
@given(st.decimals(min_value=0, max_value=10**9, places=6, allow_nan=False, allow_infinity=False))
def test_decimal_cpu_is_the_ceiling_of_a_thousand_times_the_value(value: Decimal) -> None:
    expected = int((value * 1000).to_integral_value(rounding="ROUND_CEILING"))
    assert parse_cpu_milli(f"{value:f}") == expected
    assert parse_cpu_milli(f"{value * 1000:f}m") == expected
    assert parse_cpu_milli(f"{value:e}") == expected  # exponent form: 1.5e+2


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(
        [("Ki", Ki), ("Mi", Mi), ("Gi", Gi), ("k", 10**3), ("M", 10**6), ("G", 10**9), ("", 1)]
    ),
)
def test_suffixes_multiply(number: int, suffix: tuple[str, int]) -> None:
    name, factor = suffix
    assert parse_bytes(f"{number}{name}") == number * factor
    assert parse_bytes(f"{number}e3") == number * 1000
