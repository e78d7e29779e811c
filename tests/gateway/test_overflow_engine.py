"""The overflow with two REAL upstreams on loopback: a llama-server as the
local engine (one slot) and a second llama-server started with --api-key as
the overflow endpoint, which refuses any request without that key (the
engine's own check, not ours). Callers use the official `openai` client. A
hanging overflow is a bare socket that accepts and never answers.

Whether a generation runs or stopped is read from each engine's own /slots
and /metrics (see test_engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from localmodel.gateway.server import RunningGateway
from localmodel.gateway_contract import GatewayConfig
from tests.gateway.harness import GatewayFactory, Gateways, RawClient, wait_until
from tests.gateway.llama import llama_server, processing, wait_engine
from tests.harness.engines import LlamaServer

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

KEY = "sk-engine-overflow-5d1e"
LONG = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True}
SAY_HI: list[Any] = [{"role": "user", "content": "Say hi."}]
SHORT = {"messages": SAY_HI, "max_tokens": 8, "temperature": 0}


@dataclass
class Pair:
    local: LlamaServer
    far: LlamaServer


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("overflow-engines")
    with (
        llama_server(workdir, slots=1) as local,
        llama_server(workdir, slots=1, extra=["--alias", "far-gemma"], api_key=KEY) as far,
    ):
        yield Pair(local, far)


async def far_status(session: aiohttp.ClientSession, far: LlamaServer, key: str = "") -> int:
    """The second engine's status for a short chat, with the bearer `key` if any."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(far.url + "/v1/chat/completions", json=SHORT,
                            headers=headers) as resp:
        return resp.status


async def far_prompt_tokens(session: aiohttp.ClientSession, far: LlamaServer) -> float:
    """Prompt tokens the overflow engine processed (its /metrics needs the key too)."""
    async with session.get(far.url + "/metrics", headers=far.headers) as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("llamacpp:prompt_tokens_total "):
                return float(line.split()[1])
    raise AssertionError("llamacpp:prompt_tokens_total not in the overflow's /metrics")


@pytest.fixture
async def gateway(engines: Pair) -> AsyncIterator[GatewayFactory]:
    gateways = Gateways()

    async def make(**overrides: Any) -> tuple[RunningGateway, list[str]]:
        settings: dict[str, Any] = {
            "upstream": engines.local.url,
            "engine": "llama-server",
            "listen_host": "127.0.0.1",
            "listen_port": 0,
            "model": "gemma3-270m",
            "slots": 1,
            "overflow_url": engines.far.url + "/v1",
            "overflow_model": "far-gemma",
            "overflow_after": 0.5,
            "overflow_api_key": KEY,
        }
        return await gateways.start(GatewayConfig(**(settings | overrides)))

    yield make
    await gateways.stop()
    async with aiohttp.ClientSession() as session:
        await wait_engine(session, engines.local, 0)
        await wait_engine(session, engines.far, 0)


async def hold(gw: RunningGateway, engines: Pair) -> RawClient:
    holder = await RawClient.send(gw.port, "/v1/completions", LONG)
    async with aiohttp.ClientSession() as session:
        await wait_engine(session, engines.local, 1)
    return holder


async def test_the_overflow_engine_requires_its_key(engines: Pair) -> None:
    """Control: the second server really is a server that needs the key."""
    async with aiohttp.ClientSession() as session:
        assert await far_status(session, engines.far) == 401
        assert await far_status(session, engines.far, KEY) == 200


async def test_held_slot_overflows_foreground_to_the_second_engine_with_the_key(
    engines: Pair, gateway: GatewayFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    gw, log = await gateway()
    async with aiohttp.ClientSession() as session:
        holder = await hold(gw, engines)
        # The overflow's own time for this request, measured directly while the
        # local engine is busy too (two engines share this machine's cores).
        start = time.monotonic()
        assert await far_status(session, engines.far, KEY) == 200
        own = time.monotonic() - start
        before = await far_prompt_tokens(session, engines.far)
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="caller") as client:
            start = time.monotonic()
            raw = await client.chat.completions.with_raw_response.create(
                model="gemma3-270m", messages=SAY_HI, max_tokens=8
            )
            took = time.monotonic() - start
        reply = raw.parse()
        assert raw.headers["X-LocalModel-Served-By"] == "overflow"
        assert reply.choices[0].message.content
        assert reply.model == "far-gemma"  # the overflow's alias: the name was replaced
        assert await far_prompt_tokens(session, engines.far) > before  # the far engine did it
        assert await processing(session, engines.local) == 1  # only the holder ran locally
        assert 0.5 <= took < 0.5 + own + 1.5
        # Background: 429 at once, nothing sent anywhere.
        before = await far_prompt_tokens(session, engines.far)
        async with openai.AsyncOpenAI(
            base_url=gw.url + "/v1", api_key="caller", max_retries=0
        ) as client:
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(
                    model="x",
                    messages=SAY_HI,
                    max_tokens=8,
                    extra_headers={"X-Priority": "background"},
                )
        assert await far_prompt_tokens(session, engines.far) == before
        assert await processing(session, engines.local) == 1
        holder.close()
        await wait_engine(session, engines.local, 0)
        # Slot free: served locally, the overflow untouched.
        before = await far_prompt_tokens(session, engines.far)
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="caller") as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="x", messages=SAY_HI, max_tokens=8
            )
        assert raw.headers["X-LocalModel-Served-By"] == "local"
        assert await far_prompt_tokens(session, engines.far) == before
        outputs = [
            await (await session.get(url)).text()
            for url in (gw.admin_url + "/metrics", gw.url + "/slots")
        ]
    await wait_until(lambda: len(log) >= 4)
    served = [(json.loads(line)["served_by"], json.loads(line)["outcome"]) for line in log]
    assert ("overflow", "ok") in served and ("local", "rejected_busy") in served
    captured = capfd.readouterr()
    for text in [*outputs, *log, captured.out, captured.err, repr(gw.gateway.config)]:
        assert KEY not in text
    print(f"overflowed in {took:.3f}s: after 0.5s + its own {own:.3f}s")


async def test_caller_leaving_an_overflowed_stream_stops_the_second_engine(
    engines: Pair, gateway: GatewayFactory
) -> None:
    gw, log = await gateway(overflow_after=0)
    holder = await hold(gw, engines)
    body = {**LONG, "stream": True}
    async with aiohttp.ClientSession() as session:
        client = await RawClient.send(gw.port, "/v1/completions", body)
        await client.reader.readline()
        await wait_engine(session, engines.far, 1)
        await asyncio.sleep(0.3)
        left = time.monotonic()
        client.close()
        idle = await wait_engine(session, engines.far, 0, timeout=5)
        print(f"overflow engine idle {1000 * (idle - left):.1f} ms after the caller left")
        assert idle - left < 1.0
        holder.close()
    await wait_until(lambda: len(log) == 2)
    assert json.loads(log[0])["cancel_reason"] == "disconnect"
    assert json.loads(log[0])["served_by"] == "overflow"


@contextlib.asynccontextmanager
async def hanging_endpoint() -> AsyncIterator[tuple[str, list[float]]]:
    """Accepts connections, reads, never answers; records when each was closed."""
    closed: list[float] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        closed.append(time.monotonic())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", closed
    finally:
        server.close()


async def test_hanging_overflow_neither_holds_callers_past_the_deadline_nor_the_queue(
    engines: Pair, gateway: GatewayFactory
) -> None:
    async with hanging_endpoint() as (url, closed):
        gw, log = await gateway(overflow_url=url, overflow_after=0)
        holder = await hold(gw, engines)
        async with aiohttp.ClientSession() as session:
            start = time.monotonic()
            async with session.post(
                gw.url + "/v1/chat/completions", json=SHORT, headers={"X-Request-Timeout": "1.5"}
            ) as resp:
                took = time.monotonic() - start
                assert resp.status == 504
            assert 1.5 <= took < 3.0
            await wait_until(lambda: len(closed) == 1, timeout=2)
            assert closed[0] - (start + 1.5) < 0.7  # the overflow connection was closed
            # The local queue still works: a waiting request gets the freed slot
            # although its overflow attempt hangs (cooling down: no second attempt).
            gw.gateway.breaker.succeeded()
            waiting = await RawClient.send(gw.port, "/v1/chat/completions", SHORT)
            await wait_until(lambda: gw.gateway.board.snapshot().queued == 1, timeout=5)
            holder.close()
            status, headers, _ = await waiting.response()
            assert (status, headers["x-localmodel-served-by"]) == (200, "local")
            await wait_until(lambda: len(closed) == 2, timeout=2)  # its attempt was closed
    docs = [json.loads(line) for line in log]
    assert [d.get("overflow_error") for d in docs if d["status"] == 504] == ["timeout"]
