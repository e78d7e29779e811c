"""Findings, the report, its table and JSON forms, and the exit status. Pure."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from localmodel.facts.quantity import format_bytes
from localmodel.printable import printable

# Characters of one fact or finding as printed: what an engine, a gateway or the
# cluster said is in them, bounded and cleaned (localmodel.printable).
MAX_SHOWN = 4000

__all__ = ["Finding", "Report", "Verdict", "exit_status", "render_table", "to_json"]


class Verdict(StrEnum):
    """A finding's verdict: ok, warn or fail."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    """One answer of the doctor: which check, its verdict, what was seen and what to do."""

    check: str  # which question: models-per-node, queue, cancellation, speed, ...
    verdict: Verdict
    message: str  # what was seen
    fix: str = ""  # what to do ("" when nothing needs doing)


@dataclass(frozen=True)
class Report:
    """Keeps the doctor's facts and findings, as the table and the JSON show them."""

    facts: Mapping[str, Any]
    findings: Sequence[Finding] = field(default_factory=tuple)


def exit_status(findings: Iterable[Finding], *, strict: bool = False) -> int:
    """0 when all is ok; 2 on any failure; 1 on warnings only with ``strict``."""
    verdicts = {f.verdict for f in findings}
    if Verdict.FAIL in verdicts:
        return 2
    if strict and Verdict.WARN in verdicts:
        return 1
    return 0


def to_json(report: Report) -> str:
    return json.dumps(
        {
            "facts": _clean(dict(report.facts)),
            "findings": [
                {"check": f.check, "verdict": f.verdict.value,
                 "message": printable(f.message, MAX_SHOWN), "fix": printable(f.fix, MAX_SHOWN)}
                for f in report.findings
            ],
        },
        indent=2,
    )


def _clean(value: Any) -> Any:
    """Every string in facts bounded and cleaned, keys too."""
    if isinstance(value, str):
        return printable(value, MAX_SHOWN)
    if isinstance(value, Mapping):
        return {printable(str(k), 200): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def render_table(report: Report, width: int = 100) -> str:
    """Facts as `key: value` lines, then one aligned row per finding, fixes below."""
    lines: list[str] = []
    if report.facts:
        key_width = max(len(k) for k in report.facts)
        for key, value in report.facts.items():
            shown = printable(_show(value, key), MAX_SHOWN)
            parts = textwrap.wrap(shown, max(40, width - key_width - 2)) or [shown]
            lines.append(f"{key:<{key_width}}  {parts[0]}")
            lines.extend(" " * (key_width + 2) + part for part in parts[1:])
        lines.append("")
    if not report.findings:
        lines.append("no findings")
        return "\n".join(lines) + "\n"
    check_width = max(len("CHECK"), *(len(f.check) for f in report.findings))
    head = f"{'VERDICT':<7}  {'CHECK':<{check_width}}  "
    indent = " " * len(head)
    lines.append(head + "FINDING")
    text_width = max(40, width - len(indent))
    for f in report.findings:
        message = textwrap.wrap(printable(f.message, MAX_SHOWN), text_width) or [""]
        lines.append(f"{f.verdict.value:<7}  {f.check:<{check_width}}  {message[0]}")
        lines.extend(indent + rest for rest in message[1:])
        if f.fix:
            fix = textwrap.wrap("fix: " + printable(f.fix, MAX_SHOWN), text_width,
                                subsequent_indent="     ")
            lines.extend(indent + part for part in fix)
    return "\n".join(lines) + "\n"


def _show(value: Any, key: str = "") -> str:
    if value is None:
        return "none" if key.startswith("cgroup_") else "unknown"  # no limit set
    if key.endswith("_bytes") and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_show(v, str(k))}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return " ".join(map(str, value)) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
