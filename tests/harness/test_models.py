"""The harness's GGUF file server: files by their cache names, counted, on the
address pods use; `python -m tests.harness models-url` prints its base URL."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.models import ModelFileServer, request_counts

ROOT = Path(__file__).resolve().parents[2]
CONTENT = b"GGUF" + bytes(range(256)) * 16


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ModelFileServer]:
    (tmp_path / "tiny.gguf").write_bytes(CONTENT)
    (tmp_path / "notes.txt").write_text("not a model")
    s = ModelFileServer(tmp_path).start()
    try:
        yield s
    finally:
        s.stop()


def get(url: str, method: str = "GET") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_serves_the_files_by_their_cache_names_and_counts_each_get(
    server: ModelFileServer,
) -> None:
    assert request_counts(server.url) == {}
    status, body = get(server.url_of("tiny.gguf"))
    assert (status, hashlib.sha256(body).hexdigest()) == (200, hashlib.sha256(CONTENT).hexdigest())
    assert get(server.url_of("tiny.gguf"))[0] == 200
    assert get(server.url_of("tiny.gguf"), method="HEAD")[0] == 200  # a HEAD is no download
    assert request_counts(server.url) == {"tiny.gguf": 2}
    assert server.counts() == {"tiny.gguf": 2}


@pytest.mark.parametrize("path", ["missing.gguf", "notes.txt", "../tiny.gguf", "%2e%2e/x.gguf"])
def test_only_gguf_files_in_the_directory_are_served(server: ModelFileServer, path: str) -> None:
    assert get(f"{server.url}/{path}")[0] == 404


def test_a_wildcard_bind_needs_the_address_pods_use(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="say which address pods use"):
        ModelFileServer(tmp_path, bind="0.0.0.0")


def host_address() -> str:
    """An address of this machine other than loopback (as a pod would use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        address: str = s.getsockname()[0]
    assert not address.startswith("127."), "this machine has no non-loopback address"
    return address


def test_bound_everywhere_and_announced_by_the_host_address(tmp_path: Path) -> None:
    (tmp_path / "tiny.gguf").write_bytes(CONTENT)
    address = host_address()
    s = ModelFileServer(tmp_path, bind="0.0.0.0", advertise=address).start()
    try:
        assert s.url == f"http://{address}:{s.port}"
        assert get(s.url_of("tiny.gguf"))[0] == 200
        assert request_counts(f"http://127.0.0.1:{s.port}") == {"tiny.gguf": 1}
    finally:
        s.stop()


def harness(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.harness", *argv],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_models_url_prints_the_running_servers_url(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    # A state file as `up` writes it, whose supervisor (this test process) is alive.
    state.write_text(
        json.dumps(
            {
                "supervisor_pid": os.getpid(),
                "supervisor_executable": sys.executable,
                "models": {"url": "http://10.0.0.5:41234", "directory": "/c/models"},
            }
        )
    )
    done = harness("--state", str(state), "models-url")
    assert (done.returncode, done.stdout) == (0, "http://10.0.0.5:41234\n"), done.stderr
    gone = harness("--state", str(tmp_path / "none.json"), "models-url")
    assert gone.returncode == 1 and "no test cluster is up" in gone.stderr
