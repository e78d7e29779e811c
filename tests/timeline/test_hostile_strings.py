"""What a gateway (anyone's image) or an engine says, printed by `timeline`
and `doctor` only bounded and cleaned (localmodel.printable): terminal
escapes, carriage returns, bidi overrides, lone surrogates, huge strings,
invalid UTF-8; and answers that would have crashed the reader (deep nesting,
numbers out of range, the wrong types), refused with a reason. The ledger
comes from a real HTTP server on loopback standing in for a gateway."""

from __future__ import annotations

import json
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from localmodel.cli import main
from localmodel.doctor.report import Finding, Report, Verdict, render_table, to_json
from localmodel.gateway_contract import parse_entries

pytestmark = pytest.mark.unit

ESC = "\x1b[2J\x1b[H"
HOSTILE = ESC + "\rroot\u202e\ud800\n" + "c" * 300_000


def inert(text: str) -> bool:
    """Nothing in it acts on a terminal (newlines between lines aside)."""
    return not [c for line in text.split("\n") for c in line
                if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


def entry(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "request_id": HOSTILE, "caller": HOSTILE, "session": HOSTILE, "priority": "foreground",
        "route": "/api/chat", "model": HOSTILE, "outcome": HOSTILE, "served_by": "local",
        "arrival": 1000.0, "duration_s": 30.0, "queue_wait_s": 20.0, "slot_s": 10.0,
        "waited_behind": [{"caller": HOSTILE, "priority": ESC, "seconds": 20.0}],
        "rewrite": True, "reread_s": 1.0, "prefill_s": 2.0, "decode_s": 5.0,
    }
    return base | fields


@dataclass
class Ledger:
    """What the stand-in gateway answers, and where it listens."""

    body: bytes = b""
    url: str = ""


@pytest.fixture
def gateway() -> Iterator[Ledger]:
    """A stand-in gateway answering GET /ledger with whatever the test puts in."""
    ledger = Ledger()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ledger.body)))
            self.end_headers()
            self.wfile.write(ledger.body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ledger.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield ledger
    finally:
        server.shutdown()
        server.server_close()


def serve(ledger: Ledger, body: bytes) -> str:
    ledger.body = body
    return ledger.url


@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_timeline_prints_a_hostile_ledger_bounded_and_cleaned(
    gateway: Ledger, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    ledger = {"entries": [entry(), entry(arrival="soon", duration_s=float("inf"),
                                        queue_wait_s=10**400, waited_behind="x",
                                        extra={"nested": [1, 2]})]}
    raw = json.dumps(ledger).encode().replace(b"Infinity", b"1e999")
    url = serve(gateway, raw)
    assert main(["timeline", "m", "--gateway-url", url, "-o", output]) == 0
    out = capsys.readouterr().out
    assert inert(out), out[:500]
    assert len(out) < 20_000, len(out)  # not 300 KB a string
    if output == "table":
        assert "\\x1b[2J\\x1b[H\\rroot\\u202e\\ud800\\nccc" in out


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"[" * 60_000, "nested deeper"),
        (b'{"entries": "x"}', "no `entries` list"),
        (b'{"entries": [1]}', "entries[0] is not an object"),
        (b"\x1b[2J not json", "not a ledger"),
    ],
)
def test_timeline_refuses_an_answer_it_cannot_read_naming_why(
    gateway: Ledger, capsys: pytest.CaptureFixture[str], answer: bytes, reason: str
) -> None:
    url = serve(gateway, answer)
    assert main(["timeline", "m", "--gateway-url", url]) == 2
    err = capsys.readouterr().err
    assert reason in err and inert(err), err


def test_timeline_refuses_a_ledger_over_its_bound(
    gateway: Ledger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("localmodel.timeline.cli.MAX_LEDGER_BYTES", 1000)
    url = serve(gateway, json.dumps({"entries": [entry(caller="x" * 2000)]}).encode())
    assert main(["timeline", "m", "--gateway-url", url]) == 2
    assert "larger than 1000 bytes" in capsys.readouterr().err


def test_parsed_entries_hold_only_bounded_clean_strings_and_finite_numbers() -> None:
    (parsed,) = parse_entries({"entries": [entry(duration_s=float("nan"), slot_s=10**400)]})
    assert parsed["duration_s"] is None and parsed["slot_s"] is None
    for value in [*parsed.values(), *parsed["waited_behind"][0].values()]:
        if isinstance(value, str):
            assert inert(value) and len(value) < 250


def test_doctor_prints_what_an_engine_said_bounded_and_cleaned() -> None:
    report = Report(
        facts={"engine": {"version": HOSTILE, "models": [HOSTILE, b"\xff\xfe".decode("latin-1")]}},
        findings=[Finding("models-per-node", Verdict.WARN, f"model {HOSTILE} loaded",
                          fix=f"unload {HOSTILE}")],
    )
    for text in (render_table(report), to_json(report)):
        assert inert(text), text[:300]
        assert len(text) < 40_000, len(text)
    assert "model \\x1b[2J\\x1b[H\\rroot\\u202e\\ud800\\nccc" in render_table(report)
