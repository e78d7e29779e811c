"""The real engines for tests and benchmarks: where they are built, and the one
way to start one, wait until it serves and stop it.

    with llama_server(workdir, ["-t", "1", "-c", "2048"]) as engine:
        engine.url, engine.log, engine.process.pid
    with ollama_serve(workdir, models, {"OLLAMA_NUM_PARALLEL": "1"}) as server:
        server.api("/api/ps"), server.cli("create", ...), server.runner()

Where: `hack/build-engines.sh --print` (the versions each engine's build.sh
reads from its facts, and the cache paths; `built()`), unless
LOCALMODEL_LLAMA_SERVER, LOCALMODEL_LLAMA_BENCH, LOCALMODEL_OLLAMA or
LOCALMODEL_GEMMA_GGUF names another file for one part. A
missing part raises EngineMissingError (which fails a test, never skips it: CI
builds the engines first) saying how to build it.

The processes are tests/harness/processes.py's ManagedProcess: their own
session (stopping one stops its children too, e.g. Ollama's llama-server
runners), a parent-death signal, output in a log file under `workdir` named
after the engine and its port. Health is the engine's own HEALTH_PATH
(operator/localmodel/engines/).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from localmodel.engines import llama_server as llama_facts
from localmodel.engines import ollama as ollama_facts
from tests.harness.prereqs import require_part
from tests.harness.processes import ManagedProcess, free_port, http_ok
from tests.harness.tools import (
    REPO_ROOT,
    Tools,
    parse_print_output,
    print_output,
    synth_paths,
)

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-engines.sh"
# Environment variables that point one part at another file than the build's.
OVERRIDES = {
    "llama-server": "LOCALMODEL_LLAMA_SERVER",
    "llama-bench": "LOCALMODEL_LLAMA_BENCH",
    "ollama": "LOCALMODEL_OLLAMA",
    "model": "LOCALMODEL_GEMMA_GGUF",
}
# Seconds an engine gets to serve: loading the model on a busy 2-core machine.
START_TIMEOUT = 120.0
# The catalog's name for the GGUF the build fetches (Gemma 3 270M Q4_K_M), so a
# rendered pod sizes it right; Ollama serves it under this name once imported.
MODEL_TAG = "gemma3:270m"
# The GGUF (a conversion of the base google/gemma-3-270m) carries no
# `tokenizer.chat_template`, so both engines format chat in llama.cpp's
# fallback, ChatML, whose markers are plain text to Gemma: replies then hold a
# literal `<|im_end|>` (docs/engine-facts.md#a-gguf-without-a-chat-template).
# Gemma's turn format as a Jinja template for `LLAMA_ARG_CHAT_TEMPLATE`
# (llama-server, and Ollama's llama-server child, which inherits Ollama's
# environment), as the examples give it to a user: their `spec.env` is its one
# home (tests/architecture/test_engine_home.py checks both Gemma examples carry it).
GEMMA_EXAMPLE = REPO_ROOT / "examples" / "gemma-llama-server.yaml"


def example_env(example: Path) -> dict[str, str]:
    """The `spec.env` of an example LocalModel."""
    spec = yaml.safe_load(example.read_text())["spec"]
    return {e["name"]: str(e.get("value", "")) for e in spec.get("env") or []}


GEMMA_CHAT_TEMPLATE = example_env(GEMMA_EXAMPLE)["LLAMA_ARG_CHAT_TEMPLATE"]
CHAT_TEMPLATE_ENV = {"LLAMA_ARG_CHAT_TEMPLATE": GEMMA_CHAT_TEMPLATE}
# Chat-template markers of the common formats (ChatML, Gemma, Llama 3): none
# may reach a caller's reply.
TEMPLATE_MARKERS = re.compile(
    r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>"
    r"|<(?:start|end)_of_turn>|<eos>|<bos>"
)


def template_markers(reply: str) -> list[str]:
    """The chat-template markers a reply holds (it should hold none)."""
    return TEMPLATE_MARKERS.findall(reply)


# GGUF value types (ggml's gguf.h: GGUF_TYPE_*) and the bytes of the fixed-size ones.
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_keys(path: Path) -> list[str]:
    """The metadata keys of a GGUF file (v2/v3 header), values skipped."""
    with path.open("rb") as f:
        def u(size: int) -> int:
            return int.from_bytes(f.read(size), "little")

        def skip(kind: int) -> None:
            if kind == _GGUF_STRING:
                f.seek(u(8), os.SEEK_CUR)
            elif kind == _GGUF_ARRAY:
                item, count = u(4), u(8)
                if item in _GGUF_FIXED:
                    f.seek(_GGUF_FIXED[item] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(_GGUF_FIXED[kind], os.SEEK_CUR)

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        f.seek(4 + 8, os.SEEK_CUR)  # version, tensor count
        keys = []
        for _ in range(u(8)):
            keys.append(f.read(u(8)).decode())
            skip(u(4))
        return keys


class EngineMissingError(RuntimeError):
    """A built engine part is not there; the message says which and how to build it."""


@functools.cache
def built() -> Tools:
    """What `hack/build-engines.sh --print` says: the parts' paths and the versions."""
    try:
        return parse_print_output(print_output(BUILD_SCRIPT))
    except (OSError, subprocess.SubprocessError) as exc:
        raise EngineMissingError(f"cannot run {BUILD_SCRIPT} --print: {exc}") from exc


def path(name: str) -> Path:
    """Where part `name` is (llama-server, llama-bench, ollama, ollama-lib, model,
    llama.cpp-source), present or not."""
    override = os.environ.get(OVERRIDES.get(name, ""), "")
    if override:
        return Path(override)
    require_part(name)
    if name not in built().paths:
        raise EngineMissingError(f"{BUILD_SCRIPT.name} --print names no {name!r} part")
    return built().paths[name]


def synthetic_model(shape: str) -> Path:
    """The synthetic real-shape GGUF `shape` (hack/synth-gguf.py, issue 45): the
    build's `synth-<shape>` part (gemma3-1b; `bash hack/build-engines.sh synth`),
    else the script's cache path for it (written by `python hack/synth-gguf.py
    <shape>`); EngineMissingError if it is not there."""
    name = f"synth-{shape}"
    found = path(name) if name in built().paths else synth_paths(shape).get(shape)
    if found is None or not found.is_file():
        raise EngineMissingError(
            f"no synthetic {shape} GGUF ({found}); write it with: python hack/synth-gguf.py "
            f"{shape} (gemma3-1b: bash hack/build-engines.sh synth)")
    return found


def missing(*names: str) -> list[str]:
    """'name (path)' for each of `names` that is not built."""
    return [f"{n} ({path(n)})" for n in names if not path(n).exists()]


def require(*names: str) -> Path:
    """The path of the (last) part named; EngineMissingError if any of them is missing."""
    absent = missing(*names)
    if absent:
        raise EngineMissingError(
            "needs the real engines built by hack/build-engines.sh, missing: "
            + ", ".join(absent)
            + ". Build them with: bash hack/build-engines.sh"
        )
    return path(names[-1])


def versions() -> dict[str, str]:
    """The pinned versions the build uses (llama-cpp-python, ollama, ...)."""
    return built().versions


def ollama_version() -> str:
    """The built Ollama's version without the v: `0.34.4`."""
    return versions()["ollama"].removeprefix("v")


# ---- a running engine ---------------------------------------------------------


@dataclass
class RunningEngine:
    """An engine process on a loopback port."""

    port: int
    process: ManagedProcess
    env: dict[str, str] = field(default_factory=dict)
    api_key: str = ""  # llama-server --api-key: every endpoint but /health needs it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.process.log_path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        return self.process.log_text()

    def api(
        self, path: str, body: Mapping[str, Any] | None = None, timeout: float = 300.0
    ) -> tuple[int, Any]:
        """GET (no body) or POST JSON; returns (status, parsed JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"} | self.headers
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

    def wait_healthy(self, health_path: str, timeout: float = START_TIMEOUT) -> None:
        self.process.wait_ready(
            f"{self.process.name} {health_path}", lambda: http_ok(self.url + health_path), timeout
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        return self.process.stop(timeout)


class LlamaServer(RunningEngine):
    """llama.cpp's llama-server serving the built GGUF."""

    def wait_healthy(self, health_path: str = llama_facts.HEALTH_PATH,
                     timeout: float = START_TIMEOUT) -> None:
        super().wait_healthy(health_path, timeout)


def llama_server_argv(port: int, args: Sequence[str] = (),
                      rendered: Sequence[str] | None = None,
                      model: Path | None = None) -> list[str]:
    """llama-server's command line: the built model (or `model`) on
    127.0.0.1:`port`, then `args`. `rendered`: a rendered pod's llama-server
    arguments, run as they are but for this machine's model path, host and port
    (`args` follow them)."""
    binary = str(require("llama-server"))
    model = str(model or require("model"))
    if rendered is None:
        return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), *args]
    own = list(rendered)
    for flag, value in (("-m", model), ("--port", str(port)), ("--host", "127.0.0.1")):
        if flag in own:
            own[own.index(flag) + 1] = value
        else:
            own += [flag, value]
    return [binary, *own, *args]


def start_llama_server(
    workdir: Path,
    args: Sequence[str] = (),
    *,
    rendered: Sequence[str] | None = None,
    api_key: str = "",
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    model: Path | None = None,
) -> LlamaServer:
    """Start llama-server (see `llama_server_argv`) without waiting for it; its log
    is workdir/llama-server-PORT.log. `env`: its whole environment (default: ours);
    `preexec` runs in the child before exec (e.g. `Cgroup.join`); `model`: another
    GGUF than the built one (e.g. `synthetic_model`)."""
    port = free_port()
    argv = llama_server_argv(port, args, rendered, model)
    if api_key:
        argv += ["--api-key", api_key]
    workdir.mkdir(parents=True, exist_ok=True)
    process = ManagedProcess(
        "llama-server", argv, workdir / f"llama-server-{port}.log",
        env=None if env is None else dict(env), preexec=preexec,
    )
    process.start()
    return LlamaServer(port, process, dict(env or {}), api_key)


@contextlib.contextmanager
def llama_server(
    workdir: Path,
    args: Sequence[str] = (),
    *,
    rendered: Sequence[str] | None = None,
    api_key: str = "",
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    timeout: float = START_TIMEOUT,
    model: Path | None = None,
) -> Iterator[LlamaServer]:
    """A llama-server that answers its health check; stopped (by pid) afterwards."""
    engine = start_llama_server(
        workdir, args, rendered=rendered, api_key=api_key, env=env, preexec=preexec,
        model=model,
    )
    try:
        engine.wait_healthy(timeout=timeout)
        yield engine
    finally:
        engine.stop()


class Ollama(RunningEngine):
    """`ollama serve` with its own HOME (it writes `$HOME/.ollama/id_ed25519`),
    port and model store, a clean environment (no variable of the caller leaks
    in), and its llama-server runners visible through psutil."""

    def wait_healthy(self, health_path: str = ollama_facts.HEALTH_PATH,
                     timeout: float = START_TIMEOUT) -> None:
        super().wait_healthy(health_path, timeout)

    def cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """The `ollama` CLI against this server (e.g. `create NAME -f Modelfile`)."""
        return subprocess.run(
            [str(require("ollama")), *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )

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


def _name(p: psutil.Process) -> str:
    try:
        return str(p.name())
    except psutil.Error:
        return ""


def ollama_env(home: Path, models: Path, port: int) -> dict[str, str]:
    """The whole environment `ollama serve` gets: its binary's directory on PATH,
    HOME, where it listens and where its model store is."""
    binary = require("ollama")
    return {
        "PATH": f"{binary.parent}:/usr/bin:/bin",
        "HOME": str(home),
        "OLLAMA_HOST": f"127.0.0.1:{port}",
        "OLLAMA_MODELS": str(models),
    }


def start_ollama(
    workdir: Path,
    models: Path,
    env: Mapping[str, str] | None = None,
    *,
    preexec: Callable[[], None] | None = None,
    timeout: float = START_TIMEOUT,
) -> Ollama:
    """`ollama serve` with HOME under `workdir`, on a free port, `env` on top of
    `ollama_env`; returns once it answers (stopped again if it never does)."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    port = free_port()
    full_env = ollama_env(home, models, port) | dict(env or {})
    process = ManagedProcess(
        "ollama serve", [str(require("ollama")), ollama_facts.SERVE],
        workdir / f"ollama-{port}.log", env=full_env, preexec=preexec,
    )
    process.start()
    server = Ollama(port, process, full_env)
    try:
        server.wait_healthy(timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def ollama_serve(
    workdir: Path,
    models: Path,
    env: Mapping[str, str] | None = None,
    *,
    preexec: Callable[[], None] | None = None,
    timeout: float = START_TIMEOUT,
) -> Iterator[Ollama]:
    """A serving `ollama serve` (see `start_ollama`), stopped afterwards."""
    server = start_ollama(workdir, models, env, preexec=preexec, timeout=timeout)
    try:
        yield server
    finally:
        server.stop()
