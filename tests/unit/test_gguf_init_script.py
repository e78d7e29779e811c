"""llama-server's init step, run for real: /bin/sh, curl and sha256sum against
a local HTTP server that serves a small file (the real pod runs the same
script with the engine image's curl; here the machine's).

Downloaded once, checked before use, never replaced by a bad download.
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
from localmodel.render import gguf_init_script

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


def run(models: Path, gguf: GGUF) -> subprocess.CompletedProcess[str]:
    models.mkdir(exist_ok=True)
    return subprocess.run(
        ["/bin/sh", "-c", gguf_init_script(gguf, str(models))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def spec(server: Server, sha: str = SHA, path: str = "/m/gemma.gguf") -> GGUF:
    return GGUF(url=server.url + path, sha256=sha)


def test_first_start_downloads_and_records_the_checksum(tmp_path: Path, server: Server) -> None:
    out = run(tmp_path, spec(server))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "gemma.gguf").read_bytes() == CONTENT
    assert (tmp_path / "gemma.gguf.sha256").read_text().strip() == SHA
    assert not (tmp_path / "gemma.gguf.part").exists()
    assert server.requests == ["/m/gemma.gguf"]


def test_restart_finds_the_file_and_downloads_nothing(tmp_path: Path, server: Server) -> None:
    assert run(tmp_path, spec(server)).returncode == 0
    out = run(tmp_path, spec(server))
    assert out.returncode == 0
    assert "no download" in out.stdout
    assert server.requests == ["/m/gemma.gguf"]


def test_a_file_already_there_is_checked_once_not_downloaded(
    tmp_path: Path, server: Server
) -> None:
    (tmp_path / "gemma.gguf").write_bytes(CONTENT)  # copied onto the volume by hand
    out = run(tmp_path, spec(server))
    assert out.returncode == 0 and "sha256 checked" in out.stdout
    assert server.requests == []
    assert (tmp_path / "gemma.gguf.sha256").read_text().strip() == SHA


def test_a_wrong_download_fails_and_leaves_nothing(tmp_path: Path, server: Server) -> None:
    server.body = CONTENT + b"tampered"
    out = run(tmp_path, spec(server))
    assert out.returncode != 0
    assert "not " + SHA in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_wrong_download_never_replaces_a_good_file(tmp_path: Path, server: Server) -> None:
    old = b"GGUF older model"
    (tmp_path / "gemma.gguf").write_bytes(old)
    server.body = CONTENT + b"tampered"
    # The spec names a new checksum; the old file does not match, the download is bad.
    out = run(tmp_path, spec(server))
    assert out.returncode != 0
    assert (tmp_path / "gemma.gguf").read_bytes() == old


def test_a_changed_checksum_replaces_the_file(tmp_path: Path, server: Server) -> None:
    (tmp_path / "gemma.gguf").write_bytes(b"GGUF older model")
    (tmp_path / "gemma.gguf.sha256").write_text(hashlib.sha256(b"GGUF older model").hexdigest())
    out = run(tmp_path, spec(server))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "gemma.gguf").read_bytes() == CONTENT
    assert server.requests == ["/m/gemma.gguf"]


def test_an_unreachable_url_fails_the_start(tmp_path: Path, server: Server) -> None:
    out = run(tmp_path, GGUF(url=server.url + "/missing", sha256=SHA, file="gemma.gguf"))
    assert out.returncode != 0
    assert not (tmp_path / "gemma.gguf").exists()


def test_quotes_in_names_stay_data(tmp_path: Path, server: Server) -> None:
    # The URL is validated (no whitespace), but shell metacharacters must stay data.
    marker = tmp_path / "pwned"
    url = server.url + f"/m/$(touch${{IFS}}{marker})`touch${{IFS}}{marker}`;x.gguf"
    out = run(tmp_path, GGUF(url=url, sha256=SHA, file="gemma.gguf"))
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert "touch" in server.requests[0]  # the URL went to curl as one literal argument
