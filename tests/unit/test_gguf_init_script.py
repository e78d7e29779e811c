"""The download steps (operator/localmodel/engines/gguf-download.sh), run for
real: /bin/sh and sha256sum against a local HTTP server that serves a small
file. llama-server's step downloads with curl (the real pod uses the engine
image's curl; here the machine's); Ollama's runs in the operator image and
downloads with Python's standard library (engines/fetch.py.txt; here the
machine's python3), into the blob Ollama's store would make of the file.

Both: downloaded once, checked before use, never replaced by a bad download.
"""

from __future__ import annotations

import hashlib
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localmodel.api import GGUF
from localmodel.engines.llama_server.pod import gguf_init_script
from localmodel.engines.ollama.pod import ollama_gguf_script

CONTENT = b"GGUF" + bytes(range(256)) * 64
SHA = hashlib.sha256(CONTENT).hexdigest()


@dataclass
class Server:
    url: str
    requests: list[str] = field(default_factory=list)
    body: bytes = CONTENT


@pytest.fixture
def server() -> Iterator[Server]:
    if shutil.which("curl") is None or shutil.which("sha256sum") is None:
        pytest.fail("the init-step tests need curl and sha256sum on PATH", pytrace=False)
    state = Server(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            if not self.path.endswith(".gguf"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


@dataclass(frozen=True)
class Layout:
    """Where one engine's download step puts the file and its checksum record."""

    engine: str
    root: Path

    def script(self, gguf: GGUF) -> str:
        if self.engine == "ollama":
            return ollama_gguf_script(gguf, str(self.root))
        return gguf_init_script(gguf, str(self.root))

    def file(self, gguf: GGUF) -> Path:
        if self.engine == "ollama":
            return self.root / "models" / "blobs" / f"sha256-{gguf.sha256}"
        return self.root / gguf.file_name()

    def mark(self, gguf: GGUF) -> Path:
        if self.engine == "ollama":
            return self.root / "download" / f"{gguf.file_name()}.sha256"
        return self.root / f"{gguf.file_name()}.sha256"

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def run(self, gguf: GGUF) -> subprocess.CompletedProcess[str]:
        self.root.mkdir(exist_ok=True)
        return subprocess.run(
            ["/bin/sh", "-c", self.script(gguf)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture(params=["llama-server", "ollama"])
def volume(request: pytest.FixtureRequest, tmp_path: Path) -> Layout:
    return Layout(request.param, tmp_path / "volume")


def spec(server: Server, sha: str = SHA, path: str = "/m/gemma.gguf") -> GGUF:
    return GGUF(url=server.url + path, sha256=sha)


def test_first_start_downloads_and_records_the_checksum(volume: Layout, server: Server) -> None:
    g = spec(server)
    out = volume.run(g)
    assert out.returncode == 0, out.stderr
    assert volume.file(g).read_bytes() == CONTENT
    assert volume.mark(g).read_text().strip() == SHA
    assert volume.files() == sorted([volume.file(g), volume.mark(g)])  # no part file left
    assert server.requests == ["/m/gemma.gguf"]


def test_ollama_gets_the_file_as_the_blob_of_its_checksum(tmp_path: Path, server: Server) -> None:
    """Ollama's store names a blob `sha256-<hex>` after its content: the file
    lands there, so `ollama create` finds it and copies nothing."""
    out = Layout("ollama", tmp_path).run(spec(server))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "models" / "blobs" / f"sha256-{SHA}").read_bytes() == CONTENT
    assert sorted(p.name for p in (tmp_path / "models" / "blobs").iterdir()) == [f"sha256-{SHA}"]


def test_restart_finds_the_file_and_downloads_nothing(volume: Layout, server: Server) -> None:
    assert volume.run(spec(server)).returncode == 0
    out = volume.run(spec(server))
    assert out.returncode == 0
    assert "no download" in out.stdout
    assert server.requests == ["/m/gemma.gguf"]


def test_a_file_already_there_is_checked_once_not_downloaded(
    volume: Layout, server: Server
) -> None:
    g = spec(server)
    volume.file(g).parent.mkdir(parents=True)
    volume.file(g).write_bytes(CONTENT)  # copied onto the volume by hand
    out = volume.run(g)
    assert out.returncode == 0 and "sha256 checked" in out.stdout
    assert server.requests == []
    assert volume.mark(g).read_text().strip() == SHA


def test_a_wrong_download_fails_and_leaves_nothing(volume: Layout, server: Server) -> None:
    server.body = CONTENT + b"tampered"
    out = volume.run(spec(server))
    assert out.returncode != 0
    assert "not " + SHA in out.stderr
    assert volume.files() == []


def test_a_wrong_download_never_replaces_a_good_file(volume: Layout, server: Server) -> None:
    old = b"GGUF older model"
    g = spec(server)
    volume.file(g).parent.mkdir(parents=True)
    volume.file(g).write_bytes(old)
    server.body = CONTENT + b"tampered"
    # The spec names a new checksum; the old file does not match, the download is bad.
    out = volume.run(g)
    assert out.returncode != 0
    assert volume.file(g).read_bytes() == old


def test_a_changed_checksum_replaces_the_file(volume: Layout, server: Server) -> None:
    older = spec(server, sha=hashlib.sha256(b"GGUF older model").hexdigest())
    volume.file(older).parent.mkdir(parents=True)
    volume.file(older).write_bytes(b"GGUF older model")
    volume.mark(older).parent.mkdir(parents=True, exist_ok=True)
    volume.mark(older).write_text(older.sha256)
    out = volume.run(spec(server))
    assert out.returncode == 0, out.stderr
    assert volume.file(spec(server)).read_bytes() == CONTENT
    assert server.requests == ["/m/gemma.gguf"]


def test_an_unreachable_url_fails_the_start(volume: Layout, server: Server) -> None:
    g = GGUF(url=server.url + "/missing", sha256=SHA, file="gemma.gguf")
    out = volume.run(g)
    assert out.returncode != 0
    assert not volume.file(g).exists()
    assert server.requests == ["/missing"]  # a 404 is not retried


def test_quotes_in_names_stay_data(volume: Layout, server: Server, tmp_path: Path) -> None:
    # The URL is validated (no whitespace), but shell metacharacters must stay data.
    marker = tmp_path / "pwned"
    url = server.url + f"/m/$(touch${{IFS}}{marker})`touch${{IFS}}{marker}`;x.gguf"
    out = volume.run(GGUF(url=url, sha256=SHA, file="gemma.gguf"))
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert "touch" in server.requests[0]  # the URL went to the downloader as one argument
