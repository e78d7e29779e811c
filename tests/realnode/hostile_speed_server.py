#!/usr/bin/env python3
"""A tenant's hostile gateway, for tests/realnode/test_containment_on_node.py.

Installed as `/usr/local/bin/localmodel` in an image FROM the operator's
(tests/realnode/hostile_image.py), so the renderer's gateway container
(`command: [localmodel, gateway]`) runs this instead. Standard library only:
it answers the pod's probes (/readyz, /healthz: 200, so the pod is Ready and
the operator reads it) and answers each GET /speed with the next hostile
answer of ANSWERS in turn. GET /hits says how often each was served, and how
often the redirect's target was fetched (`followed`: the operator must never
follow a redirect)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 8080  # replaced by the gateway port when the image is built
ADMIN_PORT = 8090  # replaced by the admin port (where the operator reads /speed)
STALL_SECONDS = 40.0  # far past the operator's read timeout (2 s)
FLOOD_BYTES = 256 * 1024 * 1024  # streamed until the reader hangs up
CHUNK = b"[" * (1024 * 1024)

ANSWERS = (
    "overflow",  # {"totals":{"requests":1e999}}: int(inf) raised OverflowError once
    "deep",  # "[" * 60000: RecursionError in json
    "nan",  # a NaN calibration
    "infinity",  # an Infinity calibration
    "redirect",  # 302 to /followed on this very gateway
    "stall",  # headers, then nothing for STALL_SECONDS
    "flood",  # 200 and an endless body, no length
    "huge",  # 200 announcing 10^12 bytes, then a flood
)

_lock = threading.Lock()
_served = 0
_hits: dict[str, int] = {name: 0 for name in (*ANSWERS, "followed")}


def _next() -> str:
    global _served
    with _lock:
        name = ANSWERS[_served % len(ANSWERS)]
        _served += 1
        _hits[name] += 1
    return name


def _calibration(value: str) -> bytes:
    return (
        '{"calibration":{"decode_tokens_per_second":' + value
        + ',"prefill_tokens_per_second":10,"at":1},"totals":{"requests":0}}'
    ).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _flood(self, announce: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if announce is not None:
            self.send_header("Content-Length", str(announce))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0
        try:
            while sent < FLOOD_BYTES:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
        except OSError:
            pass  # the reader hung up: what it should do

    def do_GET(self) -> None:
        if self.path in ("/readyz", "/healthz"):
            self._send(200, b"ok\n")
        elif self.path == "/hits":
            with _lock:
                self._send(200, json.dumps(_hits).encode())
        elif self.path == "/followed":
            with _lock:
                _hits["followed"] += 1
            self._send(200, _calibration("5"))
        elif self.path == "/speed":
            self._speed(_next())
        else:
            self._send(404, b"{}")

    def _speed(self, name: str) -> None:
        if name == "overflow":
            self._send(200, b'{"totals":{"requests":1e999}}')
        elif name == "deep":
            self._send(200, b"[" * 60000)
        elif name == "nan":
            self._send(200, _calibration("NaN"))
        elif name == "infinity":
            self._send(200, _calibration("Infinity"))
        elif name == "redirect":
            host = self.headers.get("Host", f"127.0.0.1:{PORT}")
            self._send(302, b"{}", {"Location": f"http://{host}/followed"})
        elif name == "stall":
            time.sleep(STALL_SECONDS)
            self._send(200, _calibration("5"))
        elif name == "flood":
            self._flood(None)
        else:
            self._flood(10**12)


def main() -> None:
    """The same answers on the gateway's port (the probes) and its admin port
    (the operator's reads of /speed)."""
    servers = [ThreadingHTTPServer(("0.0.0.0", port), Handler) for port in (PORT, ADMIN_PORT)]
    for server in servers:
        server.daemon_threads = True
    print(f"hostile gateway on :{PORT} and :{ADMIN_PORT}, answers {', '.join(ANSWERS)}",
          flush=True)
    threading.Thread(target=servers[1].serve_forever, daemon=True).start()
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
