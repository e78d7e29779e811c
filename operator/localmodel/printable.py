"""Strings from outside made safe to log or print: `printable`, the one place
that bounds and cleans them. Pure.

What a caller, a gateway or an engine says (a body's `model`, a ledger's
caller, an error body) reaches logs and terminals. Raw, a string there can
move the cursor, rewrite or hide earlier lines (ANSI escapes, `\\r`), fake a
log line (`\\n`), reorder what is read (Unicode bidirectional controls), stop
a print (a lone surrogate cannot be encoded) or fill a disk (a 512 KiB model
name in every access log line). So every such string is cut to a bound, and
every control character, format character (bidi, zero width), lone surrogate
and line or paragraph separator is written as a visible escape (`\\x1b`,
`\\r`, `\\u202e`). Bytes are read as UTF-8, invalid sequences replaced
(U+FFFD).
"""

from __future__ import annotations

import unicodedata

DEFAULT_LIMIT = 256  # characters kept of one string
_SHOWN_AS_ESCAPES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(value: str | bytes, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as at most `limit` characters that print as themselves (then
    a note of what was cut), every character that would act on a terminal or
    a log shown as an escape."""
    if isinstance(value, bytes):
        window = value[: 4 * (limit + 1)]
        text = window.decode("utf-8", "replace")
        cut_note = f"...({len(value)} bytes in all)"
        whole = len(window) == len(value)
    else:
        text, cut_note, whole = value, f"...({len(value)} chars in all)", True
    out: list[str] = []
    size = kept = 0
    for char in text[: limit + 1]:
        shown = _escape(char)
        if size + len(shown) > limit:
            break
        out.append(shown)
        size += len(shown)
        kept += 1
    if kept < len(text) or not whole:
        out.append(cut_note)
    return "".join(out)


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    if unicodedata.category(char) not in _SHOWN_AS_ESCAPES:
        return char
    point = ord(char)
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"
