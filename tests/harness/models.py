"""The cached GGUF files over HTTP, where pods can download them.

A LocalModel with `gguf.url` pointing here gets its weights the way an
air-gapped cluster would from an internal mirror: no registry, no internet.
File names are as in the cache (`<cache>/models/<name>.gguf` is
`<url>/<name>.gguf`); `GET <url>/_counts` answers how many times each file was
requested (GET), so a test can show that a restart downloaded nothing.

The server runs as a thread of whoever starts it (the harness supervisor of
`python -m tests.harness up`, or a test), bound to `bind` and announced as
`advertise`: a pod on the real node reaches the host by an address the
real-node harness knows, not by loopback.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import threading
import urllib.request
from collections import Counter
from pathlib import Path

COUNTS_PATH = "/_counts"
_NAME = re.compile(r"^/([A-Za-z0-9][A-Za-z0-9._-]*[.]gguf)$")
_WILDCARD = {"0.0.0.0", "::", ""}


class ModelFileServer:
    """Serves `directory`'s GGUF files by name and counts the requests."""

    def __init__(
        self,
        directory: Path,
        bind: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
    ) -> None:
        if advertise is None and bind in _WILDCARD:
            raise ValueError(f"bound to {bind or 'all addresses'}: say which address pods use")
        self.directory = directory
        self.bind = bind
        self.advertise = advertise or bind
        self._requested_port = port
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return f"http://{host}:{self.port}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def start(self) -> ModelFileServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                if self.path == COUNTS_PATH:
                    data = json.dumps(server.counts(), sort_keys=True).encode()
                    self._head(200, len(data), "application/json")
                    if body:
                        self.wfile.write(data)
                    return
                m = _NAME.match(self.path)
                if m is not None and body:
                    server._count(m.group(1))
                path = server.directory / m.group(1) if m is not None else None
                if path is None or not path.is_file():
                    self._head(404, 0, "text/plain")
                    return
                self._head(200, path.stat().st_size, "application/octet-stream")
                if body:
                    with path.open("rb") as f:
                        shutil.copyfileobj(f, self.wfile, 1 << 20)

            def _head(self, status: int, length: int, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(length))
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in self.bind else socket.AF_INET

        self._httpd = Server((self.bind, self._requested_port), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="model-files", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def describe(self) -> dict[str, object]:
        """For the harness's state file."""
        return {"url": self.url, "directory": str(self.directory), "bind": self.bind}


def request_counts(url: str, timeout: float = 10.0) -> dict[str, int]:
    """GET requests per file so far, from a server known only by its URL."""
    with urllib.request.urlopen(url.rstrip("/") + COUNTS_PATH, timeout=timeout) as r:
        counts: dict[str, int] = json.loads(r.read())
    return counts
