"""The download steps (operator/localmodel/engines/gguf-download.sh), run for
real: /bin/sh, sha256sum and stat against a local HTTPS server (a
certificate of a test CA made with openssl, tests/harness/pki.py, trusted
through CURL_CA_BUNDLE and SSL_CERT_FILE as a pod trusts its image's CA
bundle) that serves a small file, and a plain-http one beside it.
llama-server's step downloads with curl (the real pod uses the engine image's
curl; here the machine's); Ollama's runs in the operator image and downloads
with Python's standard library (engines/fetch.py.txt; here the machine's
python3), into the blob Ollama's store would make of the file.

Both: downloaded once, checked before use, never replaced by a bad download;
https only unless allowed, never https -> http on a redirect; bounded in
size (bytes beyond the bound abort) and in time (a stalled body, a body that
drips forever); a checksum record that cannot vouch for a changed file.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localmodel.api import GGUF
from localmodel.engines.gguf import Download
from localmodel.engines.llama_server.pod import gguf_init_script
from localmodel.engines.ollama.pod import ollama_gguf_script
from tests.harness.pki import CertificateAuthority

pytestmark = pytest.mark.unit

CONTENT = b"GGUF" + bytes(range(256)) * 64
SHA = hashlib.sha256(CONTENT).hexdigest()
BOUND = 4 * len(CONTENT)  # the size bound of these tests' downloads
# Short bounds, so a stall or a slow body fails within seconds here.
STALL = 2
OVERALL = 6


@dataclass
class Server:
    url: str = ""  # https
    plain: str = ""  # the same handler over http
    requests: list[str] = field(default_factory=list)
    body: bytes = CONTENT
    stop: threading.Event = field(default_factory=threading.Event)


def _handler(state: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.requests.append(self.path)
            if self.path.startswith("/to-http/"):  # a downgrade: https -> http
                self._redirect(state.plain + "/m/" + self.path.rsplit("/", 1)[1])
            elif self.path.startswith("/to-https/"):
                self._redirect(state.url + "/m/" + self.path.rsplit("/", 1)[1])
            elif self.path.startswith("/endless/"):  # no length, bytes forever
                self._endless(pause=0.0)
            elif self.path.startswith("/drip/"):  # a byte now and then, never a stall
                self._endless(pause=0.5)
            elif self.path.startswith("/stall/"):  # headers and a little, then nothing
                self._head(len(state.body))
                self.wfile.write(state.body[:10])
                self.wfile.flush()
                state.stop.wait(30)
            elif self.path.endswith(".gguf"):
                self._head(len(state.body))
                self.wfile.write(state.body)
            else:
                self.send_error(404)

        def _head(self, length: int | None) -> None:
            self.send_response(200)
            if length is None:
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _redirect(self, to: str) -> None:
            self.send_response(302)
            self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _endless(self, pause: float) -> None:
            self._head(None)
            chunk = b"x" if pause else b"x" * 65536
            try:
                while not state.stop.is_set():
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    if pause:
                        time.sleep(pause)
            except OSError:  # the client went away: what the bound is for
                return

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """A test CA and a server certificate for 127.0.0.1: (ca, cert, key)."""
    authority = CertificateAuthority.create(tmp_path_factory.mktemp("ca"))
    pair = authority.issue("server", common_name="127.0.0.1", hosts=("127.0.0.1",), server=True)
    yield authority.cert, pair.cert, pair.key


@pytest.fixture
def server(ca: tuple[Path, Path, Path]) -> Iterator[Server]:
    for tool in ("curl", "sha256sum", "stat", "timeout", "head"):
        if shutil.which(tool) is None:
            pytest.fail(f"the init-step tests need {tool} on PATH", pytrace=False)
    state = Server()
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(ca[1], ca[2])
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    for s in (secure, plain):
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    state.url = f"https://127.0.0.1:{secure.server_address[1]}"
    state.plain = f"http://127.0.0.1:{plain.server_address[1]}"
    try:
        yield state
    finally:
        state.stop.set()
        for s in (secure, plain):
            s.shutdown()
            s.server_close()


@dataclass(frozen=True)
class Layout:
    """Where one engine's download step puts the file and its checksum record."""

    engine: str
    root: Path
    ca: Path

    def script(self, gguf: GGUF, download: Download) -> str:
        if self.engine == "ollama":
            return ollama_gguf_script(gguf, download, str(self.root))
        return gguf_init_script(gguf, download, str(self.root))

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

    def run(self, gguf: GGUF, allow_http: bool = False, max_bytes: int = BOUND
            ) -> subprocess.CompletedProcess[str]:
        self.root.mkdir(exist_ok=True)
        download = Download(max_bytes, allow_http=allow_http, stall_seconds=STALL,
                            overall_seconds=OVERALL)
        return subprocess.run(
            ["/bin/sh", "-c", self.script(gguf, download)],
            env={"PATH": os.environ["PATH"], "CURL_CA_BUNDLE": str(self.ca),
                 "SSL_CERT_FILE": str(self.ca)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture(params=["llama-server", "ollama"])
def volume(request: pytest.FixtureRequest, tmp_path: Path, ca: tuple[Path, Path, Path]
           ) -> Layout:
    return Layout(request.param, tmp_path / "volume", ca[0])


def spec(base: str, sha: str = SHA, path: str = "/m/gemma.gguf") -> GGUF:
    return GGUF(url=base + path, sha256=sha, file="gemma.gguf")


def test_first_start_downloads_and_records_the_checksum(volume: Layout, server: Server) -> None:
    g = spec(server.url)
    out = volume.run(g)
    assert out.returncode == 0, out.stderr
    assert volume.file(g).read_bytes() == CONTENT
    assert volume.mark(g).read_text().split()[0] == SHA
    assert volume.files() == sorted([volume.file(g), volume.mark(g)])  # no part file left
    assert server.requests == ["/m/gemma.gguf"]


def test_ollama_gets_the_file_as_the_blob_of_its_checksum(
    tmp_path: Path, server: Server, ca: tuple[Path, Path, Path]
) -> None:
    """Ollama's store names a blob `sha256-<hex>` after its content: the file
    lands there, so `ollama create` finds it and copies nothing."""
    out = Layout("ollama", tmp_path, ca[0]).run(spec(server.url))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "models" / "blobs" / f"sha256-{SHA}").read_bytes() == CONTENT
    assert sorted(p.name for p in (tmp_path / "models" / "blobs").iterdir()) == [f"sha256-{SHA}"]


def test_restart_finds_the_file_and_downloads_nothing(volume: Layout, server: Server) -> None:
    assert volume.run(spec(server.url)).returncode == 0
    out = volume.run(spec(server.url))
    assert out.returncode == 0
    assert "no download" in out.stdout and "unchanged since" in out.stdout
    assert server.requests == ["/m/gemma.gguf"]


def test_a_file_changed_after_its_record_is_hashed_again_and_downloaded_again(
    volume: Layout, server: Server
) -> None:
    """The record cannot vouch for a changed file: same size, its modification
    time put back, only its change time (which no process can set) tells, and
    the step hashes it, finds it wrong and downloads it again."""
    g = spec(server.url)
    assert volume.run(g).returncode == 0
    path = volume.file(g)
    before = path.stat()
    tampered = bytearray(CONTENT)
    tampered[100] ^= 0xFF
    time.sleep(0.01)  # a later change time than the record's
    with path.open("r+b") as f:  # in place: the same inode, the same size
        f.write(bytes(tampered))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_ino == before.st_ino
    out = volume.run(g)
    assert out.returncode == 0, out.stderr
    assert f"not {SHA}: downloading it again" in out.stdout
    assert path.read_bytes() == CONTENT
    assert server.requests == ["/m/gemma.gguf", "/m/gemma.gguf"]


def test_the_record_trusts_whoever_writes_the_volume(volume: Layout, server: Server) -> None:
    """What docs/security.md says the record trusts: a writer of the volume
    who replaces the file and writes a record of it (a stand-in for a hostile
    writer: it `stat`s the file as the step does) has it believed, with no hash
    and no download. Re-hashing at start was not chosen (the cost is in the
    docs): such a writer could swap the file after any check anyway."""
    g = spec(server.url)
    assert volume.run(g).returncode == 0
    path, mark = volume.file(g), volume.mark(g)
    path.write_bytes(b"GGUF not the weights")
    st = path.stat()
    stamp = (f"{st.st_size} {st.st_ino} {st.st_dev} {st.st_mtime_ns // 10**9}."
             f"{st.st_mtime_ns % 10**9:09d} {st.st_ctime_ns // 10**9}.{st.st_ctime_ns % 10**9:09d}")
    mark.write_text(f"{SHA} {stamp}\n")
    out = volume.run(g)
    assert out.returncode == 0, out.stderr
    assert "unchanged since" in out.stdout  # believed: the record is the volume's writers'
    assert path.read_bytes() == b"GGUF not the weights"
    assert server.requests == ["/m/gemma.gguf"]


def test_a_file_already_there_is_checked_once_not_downloaded(
    volume: Layout, server: Server
) -> None:
    g = spec(server.url)
    volume.file(g).parent.mkdir(parents=True)
    volume.file(g).write_bytes(CONTENT)  # copied onto the volume by hand
    out = volume.run(g)
    assert out.returncode == 0 and "sha256 checked" in out.stdout
    assert server.requests == []
    assert volume.mark(g).read_text().split()[0] == SHA
    again = volume.run(g)
    assert "unchanged since" in again.stdout  # hashed once


def test_a_wrong_download_fails_and_leaves_nothing(volume: Layout, server: Server) -> None:
    server.body = CONTENT + b"tampered"
    out = volume.run(spec(server.url))
    assert out.returncode != 0
    assert "not " + SHA in out.stderr
    assert volume.files() == []


def test_a_wrong_download_never_replaces_a_good_file(volume: Layout, server: Server) -> None:
    old = b"GGUF older model"
    g = spec(server.url)
    volume.file(g).parent.mkdir(parents=True)
    volume.file(g).write_bytes(old)
    server.body = CONTENT + b"tampered"
    # The spec names a new checksum; the old file does not match, the download is bad.
    out = volume.run(g)
    assert out.returncode != 0
    assert volume.file(g).read_bytes() == old


def test_a_changed_checksum_replaces_the_file(volume: Layout, server: Server) -> None:
    older = spec(server.url, sha=hashlib.sha256(b"GGUF older model").hexdigest())
    volume.file(older).parent.mkdir(parents=True)
    volume.file(older).write_bytes(b"GGUF older model")
    volume.mark(older).parent.mkdir(parents=True, exist_ok=True)
    volume.mark(older).write_text(older.sha256)
    out = volume.run(spec(server.url))
    assert out.returncode == 0, out.stderr
    assert volume.file(spec(server.url)).read_bytes() == CONTENT
    assert server.requests == ["/m/gemma.gguf"]


def test_an_unreachable_url_fails_the_start(volume: Layout, server: Server) -> None:
    g = GGUF(url=server.url + "/missing", sha256=SHA, file="gemma.gguf")
    out = volume.run(g)
    assert out.returncode != 0
    assert not volume.file(g).exists()
    assert server.requests == ["/missing"]  # a 404 is not retried


def test_plain_http_is_refused_unless_allowed(volume: Layout, server: Server) -> None:
    g = spec(server.plain)
    out = volume.run(g)
    assert out.returncode != 0
    assert "allows https downloads only" in out.stderr
    assert server.requests == []  # refused before any connection
    assert not volume.file(g).exists()
    allowed = volume.run(g, allow_http=True)
    assert allowed.returncode == 0, allowed.stderr
    assert volume.file(g).read_bytes() == CONTENT


@pytest.mark.parametrize("allow_http", [False, True])
def test_a_redirect_from_https_to_http_is_refused(
    volume: Layout, server: Server, allow_http: bool
) -> None:
    """Even where plain http is allowed, an https URL stays https."""
    g = spec(server.url, path="/to-http/gemma.gguf")
    out = volume.run(g, allow_http=allow_http)
    assert out.returncode != 0
    assert server.requests == ["/to-http/gemma.gguf"]  # the http location never asked
    assert not volume.file(g).exists()
    assert volume.files() == []
    print(out.stderr)


def test_a_redirect_to_https_is_followed(volume: Layout, server: Server) -> None:
    g = spec(server.url, path="/to-https/gemma.gguf")
    out = volume.run(g)
    assert out.returncode == 0, out.stderr
    assert server.requests == ["/to-https/gemma.gguf", "/m/gemma.gguf"]


def test_a_file_larger_than_the_bound_is_aborted(volume: Layout, server: Server) -> None:
    """Announced: the length says so; the bytes that came stop at the bound."""
    server.body = CONTENT * 8
    g = spec(server.url)
    out = volume.run(g)
    assert out.returncode != 0
    assert f"larger than {BOUND} bytes" in out.stderr
    assert volume.files() == []


def test_an_endless_body_is_aborted_at_the_bound(volume: Layout, server: Server) -> None:
    """No length announced and bytes forever: the step stops reading at the
    bound and removes what it wrote."""
    g = spec(server.url, path="/endless/gemma.gguf")
    began = time.monotonic()
    out = volume.run(g)
    assert out.returncode != 0
    assert f"larger than {BOUND} bytes" in out.stderr
    assert volume.files() == []
    print(f"aborted after {time.monotonic() - began:.1f} s: {out.stderr.strip()}")


def test_a_stalled_body_fails_the_step(volume: Layout, server: Server) -> None:
    g = spec(server.url, path="/stall/gemma.gguf")
    began = time.monotonic()
    out = volume.run(g)
    took = time.monotonic() - began
    assert out.returncode != 0
    assert volume.files() == []
    assert took < 30, took  # the server holds it 30 s: the stall bound ended it
    assert "too slow" in out.stderr or "is a stall" in out.stderr, out.stderr
    print(f"stall: failed after {took:.1f} s: {out.stderr.strip()}")


def test_a_body_that_never_stalls_ends_at_the_overall_bound(
    volume: Layout, server: Server
) -> None:
    g = spec(server.url, path="/drip/gemma.gguf")
    began = time.monotonic()
    out = volume.run(g)
    took = time.monotonic() - began
    assert out.returncode != 0
    assert f"{OVERALL} s" in out.stderr, out.stderr
    assert volume.files() == []
    assert took < 30, took
    print(f"drip: failed after {took:.1f} s: {out.stderr.strip()}")


@pytest.fixture
def header_drip() -> Iterator[str]:
    """A stand-in for a hostile weights server: a raw socket that answers each
    connection with its status line and headers one byte every 0.3 s (each
    within the stall bound) and never ends them. Its base URL (plain http)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def drip(conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n" + b"X-Slow: " + b"a" * 10_000
        with conn:
            for byte in head:
                if stop.wait(0.3):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:  # the client went away: what the deadline is for
                    return

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_headers_that_drip_end_at_the_overall_bound(volume: Layout, header_drip: str) -> None:
    """The overall deadline covers connecting and the headers, not only the
    body: Python's step (a watchdog) and curl's (`timeout` around curl) end
    with the deadline named, the part file gone. The outer bound (Layout.run's
    60 s) only keeps a broken step from hanging the tests."""
    out = volume.run(spec(header_drip), allow_http=True)
    assert out.returncode != 0
    said = ("took longer than 6 s (the overall deadline" if volume.engine == "ollama"
            else f"124: took longer than {OVERALL} s")
    assert said in out.stderr, out.stderr
    assert volume.files() == []


def test_quotes_in_names_stay_data(volume: Layout, server: Server, tmp_path: Path) -> None:
    # The URL is validated (no whitespace), but shell metacharacters must stay data.
    marker = tmp_path / "pwned"
    url = server.url + f"/m/$(touch${{IFS}}{marker})`touch${{IFS}}{marker}`;x.gguf"
    out = volume.run(GGUF(url=url, sha256=SHA, file="gemma.gguf"))
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert "touch" in server.requests[0]  # the URL went to the downloader as one argument
