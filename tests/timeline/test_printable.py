"""`printable`: strings from outside, bounded and cleaned before they are
logged or printed (localmodel/printable.py). Hostile strings as a table, then
properties over any text and any bytes."""

from __future__ import annotations

import io
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.printable import printable

pytestmark = pytest.mark.unit

ACTING = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # what may act on a terminal or a log


def acts(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ACTING]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("qwen3:1.7b", "qwen3:1.7b"),
        ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),  # clear screen, colour
        ("ok\rFAKE", "ok\\rFAKE"),  # carriage return: rewrites the line
        ('a\n{"msg":"forged"}', 'a\\n{"msg":"forged"}'),  # a forged log line
        ("\x9b31m", "\\x9b31m"),  # the 8-bit CSI
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028sep", "line\\u2028sep"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),  # cannot be encoded raw
        ("tab\there", "tab\\there"),
        ("café ünïcode 模型", "café ünïcode 模型"),  # printable text stays as it is
        (b"\xff\xfebad\x1b", "\ufffd\ufffdbad\\x1b"),  # invalid UTF-8, replaced
    ],
)
def test_hostile_strings_print_as_visible_escapes(value: str | bytes, shown: str) -> None:
    assert printable(value) == shown


def test_a_huge_string_is_cut_to_the_bound_and_says_so() -> None:
    huge = "\x1b[31m" + "m" * 600_000
    out = printable(huge, 64)
    assert out.startswith("\\x1b[31m") and out.endswith(f"...({len(huge)} chars in all)")
    assert len(out) <= 64 + len(f"...({len(huge)} chars in all)")
    assert printable(b"x" * 10**6, 10) == "x" * 10 + "...(1000000 bytes in all)"


def test_an_escape_is_never_cut_in_two() -> None:
    assert printable("ab\x1b", 4) == "ab...(3 chars in all)"


@given(st.text(), st.integers(min_value=1, max_value=300))
def test_any_text_comes_out_bounded_and_inert(text: str, limit: int) -> None:
    out = printable(text, limit)
    assert not acts(out)
    out.encode("utf-8")  # strict: no lone surrogate left to fail a print
    assert len(out) <= limit + len(f"...({len(text)} chars in all)")
    if len(out) <= limit and not acts(text) and "\t" not in text:
        assert out == text  # nothing to clean, nothing cut: unchanged


@given(st.binary(), st.integers(min_value=1, max_value=300))
def test_any_bytes_come_out_bounded_and_inert(raw: bytes, limit: int) -> None:
    out = printable(raw, limit)
    assert not acts(out)
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="backslashreplace")
    print(out, file=stream)
    assert len(out) <= limit + len(f"...({len(raw)} bytes in all)")
