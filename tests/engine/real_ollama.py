"""A real `ollama serve` (built by hack/build-engines.sh) for tests: its own
HOME (it writes `$HOME/.ollama/id_ed25519`), its own port and model store,
a clean environment (no variable of the test runner leaks into the engine),
its log in a file, and its llama-server children visible through psutil.

The model store ("the volume") holds the Gemma 3 270M GGUF imported once with
`FROM /path/model.gguf`; each test gets its own copy with the blobs
hard-linked, so a test may create or delete models freely.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.engine.engines import require

MODEL = "gemma3:270m"  # the name the catalog knows, so rendered pods size it right
START_TIMEOUT = 120.0  # seconds; generous for a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(home: Path, models: Path, port: int) -> dict[str, str]:
    ollama = require("ollama")
    return {
        "PATH": f"{ollama.parent}:/usr/bin:/bin",
        "HOME": str(home),
        "OLLAMA_HOST": f"127.0.0.1:{port}",
        "OLLAMA_MODELS": str(models),
    }


@dataclass
class Ollama:
    url: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: Path

    def api(
        self, path: str, body: Mapping[str, Any] | None = None, timeout: float = 300.0
    ) -> tuple[int, Any]:
        """GET (no body) or POST JSON; returns (status, parsed JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def runners(self) -> list[psutil.Process]:
        """The llama-server children (one per loaded model)."""
        try:
            kids = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [k for k in kids if _name(k) == "llama-server"]

    def runner(self, timeout: float = 60.0) -> psutil.Process:
        end = time.monotonic() + timeout
        while not (found := self.runners()):
            if time.monotonic() > end:
                raise AssertionError("no llama-server child:\n" + self.log_text()[-3000:])
            time.sleep(0.05)
        return found[0]

    def cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(require("ollama")), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        # llama-server children are in the same session: make sure none is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def _name(p: psutil.Process) -> str:
    try:
        return str(p.name())
    except psutil.Error:
        return ""


def start_ollama(workdir: Path, models: Path, env: Mapping[str, str] | None = None) -> Ollama:
    """`ollama serve` with HOME under workdir, on a free port, extra env on top."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    port = free_port()
    full_env = base_env(home, models, port) | dict(env or {})
    log = workdir / f"ollama-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(require("ollama")), "serve"],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Ollama(f"http://127.0.0.1:{port}", full_env, process, log)
    end = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            pytest.fail(
                f"ollama serve exited ({process.returncode}):\n" + log.read_text()[-3000:],
                pytrace=False,
            )
        try:
            if server.api("/api/version", timeout=2)[0] == 200:
                return server
        except OSError:
            pass
        if time.monotonic() > end:
            server.stop()
            pytest.fail("ollama serve did not answer in time:\n" + log.read_text()[-3000:])
        time.sleep(0.1)


@contextlib.contextmanager
def running_ollama(
    workdir: Path, models: Path, env: Mapping[str, str] | None = None
) -> Iterator[Ollama]:
    server = start_ollama(workdir, models, env)
    try:
        yield server
    finally:
        server.stop()


def import_gguf(workdir: Path, models: Path, name: str = MODEL) -> None:
    """Import the GGUF into the store under `name`, offline (`FROM /path`)."""
    gguf = require("model")
    workdir.mkdir(parents=True, exist_ok=True)
    modelfile = workdir / "Import.Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    with running_ollama(workdir, models) as server:
        done = server.cli("create", name, "-f", str(modelfile))
        assert done.returncode == 0, done.stdout + done.stderr


def copy_volume(src: Path, dst: Path) -> None:
    """A writable copy of a model store: blobs hard-linked (content-addressed,
    never rewritten), everything else copied."""

    def link_or_copy(s: str, d: str) -> None:
        if f"{os.sep}blobs{os.sep}" in s:
            os.link(s, d)
        else:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def wait_idle(p: psutil.Process, timeout: float, window: float = 1.0, busy: float = 0.1) -> float:
    """Seconds until `p` used less than `busy` CPU seconds in one `window`."""
    start = time.monotonic()
    last = cpu_seconds(p)
    while True:
        time.sleep(window)
        now = cpu_seconds(p)
        used, last = now - last, now
        if used < busy:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"still busy after {timeout} s ({used:.2f} CPU s in {window} s)")
