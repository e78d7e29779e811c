"""Admission before work at the router (router/admission.py,
router/wanted.py): a request holds one of --places places before its body is
read, and past them is refused with 503 and Retry-After, its body unread; at
most --body-reads bodies are read and parsed at once; the parsed body is gone
before the request is relayed.

The replicas here are small aiohttp apps that hold every request until the
test lets them go: stand-ins for a slow (or hostile) replica, so the places
stay held as long as the test needs. The callers are raw sockets, so a test
decides when (or whether) a body arrives.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from localmodel.router.admission import SMALL_BODY
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source
from tests.gateway.harness import RawClient, wait_until

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0, body_timeout=120.0)
TURN = {"model": "standin:1b", "messages": [{"role": "user", "content": "x"}]}
ANSWER = {"model": "standin:1b", "message": {"role": "assistant", "content": "y"},
          "done": True}


class HeldReplica:
    """A stand-in replica that reads each request's bytes (never parses them)
    and answers only once `go` is set: it keeps the router's places held."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.go = asyncio.Event()

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        await self.go.wait()
        return web.json_response(ANSWER)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/chat", self.chat)
        return app


Serve = Callable[..., Awaitable[tuple[RunningRouter, list[str], HeldReplica]]]


@pytest.fixture
async def held_router() -> AsyncIterator[Serve]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def make(**overrides: Any) -> tuple[RunningRouter, list[str], HeldReplica]:
        replica = HeldReplica()
        runner = web.AppRunner(replica.app(), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        cleanups.append(runner.cleanup)
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        log: list[str] = []
        config = RouterConfig(**{**CONFIG.__dict__, **overrides})
        running = await start_router(config, static_source([f"standin:1b={url}"]), log.append)
        cleanups.append(running.stop)
        return running, log, replica

    yield make
    for cleanup in reversed(cleanups):
        await cleanup()


async def _head_only(port: int, length: int, sent: bytes = b"") -> RawClient:
    """A caller that announces a body of `length` bytes and sends only `sent`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (length, sent))
    await writer.drain()
    return RawClient(reader, writer)


async def _metrics(router: RunningRouter) -> str:
    async with aiohttp.ClientSession() as session, \
            session.get(router.admin_url + "/metrics") as resp:
        return await resp.text()


async def test_past_its_places_a_request_gets_503_with_retry_after_and_its_body_unread(
        held_router: Serve) -> None:
    router, log, replica = await held_router(places=2)
    holders = [await RawClient.send(router.port, "/api/chat", TURN) for _ in range(2)]
    await wait_until(lambda: len(replica.bodies) == 2, timeout=30)
    # Its body never comes: a router that read it would wait --body-timeout (120 s)
    # and answer 408, not 503.
    late = await _head_only(router.port, 1024 * 1024)
    async with asyncio.timeout(60):
        status, headers, body = await late.response()
    assert status == 503 and headers["retry-after"] == "1"
    assert "--places" in json.loads(body)["error"]
    assert json.loads(log[-1])["status"] == 503
    assert 'localmodel_router_requests_total{route="/api/chat",status="503"} 1' in \
        await _metrics(router)
    late.close()
    replica.go.set()
    for holder in holders:
        async with asyncio.timeout(30):
            assert (await holder.response())[0] == 200
        holder.close()
    # The places are given back: the next request is served.
    again = await RawClient.send(router.port, "/api/chat", TURN)
    async with asyncio.timeout(30):
        assert (await again.response())[0] == 200
    again.close()


async def test_bodies_past_body_reads_wait_their_turn_then_are_relayed(
        held_router: Serve) -> None:
    router, _, replica = await held_router(places=8, body_reads=1)
    replica.go.set()
    # Over SMALL_BODY: a body announced smaller is read without a turn.
    large = {**TURN, "messages": [{"role": "user", "content": "x" * (SMALL_BODY + 1)}]}
    whole = json.dumps(large).encode()
    slow = await _head_only(router.port, len(whole), whole[:5])  # holds the one read
    await wait_until(lambda: router.router.reads.reading == 1, timeout=30)
    quick = await RawClient.send(router.port, "/api/chat", whole)
    await wait_until(lambda: router.router.reads.waiting == 1, timeout=30)
    assert 'localmodel_router_admission{what="body_reads_waiting"} 1' in await _metrics(router)
    assert replica.bodies == []  # the whole body waits: not read, not relayed
    slow.writer.write(whole[5:])
    for client in (slow, quick):
        async with asyncio.timeout(30):
            assert (await client.response())[0] == 200
        client.close()
    assert replica.bodies == [whole, whole]
    assert router.router.reads.reading == 0 and router.router.reads.waiting == 0


async def test_a_small_body_is_read_while_large_ones_hold_every_read(
        held_router: Serve) -> None:
    router, _, replica = await held_router(places=8, body_reads=1)
    replica.go.set()
    slow = await _head_only(router.port, SMALL_BODY + 1, b"{")  # holds the one read
    await wait_until(lambda: router.router.reads.reading == 1, timeout=30)
    chat = await RawClient.send(router.port, "/api/chat", TURN)
    async with asyncio.timeout(30):
        assert (await chat.response())[0] == 200
    assert router.router.reads.reading == 1  # the large body still holds its turn
    chat.close()
    slow.close()


def _dicts_with(key: str) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, dict) and key in o)


@pytest.mark.parametrize("model", ["standin:1b", "static/standin:1b"])
async def test_the_parsed_body_is_gone_while_the_request_is_relayed(
        held_router: Serve, model: str) -> None:
    router, _, replica = await held_router()
    marker = "zz-marker-of-this-body-only"
    # Built as text, so the test itself holds no parsed copy: a dict holding a
    # list is one the garbage collector tracks, so gc.get_objects() finds it.
    raw = (b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", '
           b'"content": "x"}], "' + marker.encode() + b'": [1]}')
    client = await RawClient.send(router.port, "/api/chat", raw)
    await wait_until(lambda: len(replica.bodies) == 1, timeout=30)
    assert marker.encode() in replica.bodies[0]  # relayed, with the field the router ignores
    assert _dicts_with(marker) == 0
    replica.go.set()
    async with asyncio.timeout(30):
        assert (await client.response())[0] == 200
    client.close()


async def test_a_body_announced_over_the_limit_gets_413_unread(held_router: Serve) -> None:
    router, log, replica = await held_router()
    # None of it is sent: a router that read it would wait --body-timeout
    # (120 s) and answer 408.
    client = await _head_only(router.port, 8 * 1024 * 1024)
    async with asyncio.timeout(60):
        status, _, body = await client.response()
    client.close()
    assert status == 413 and "--max-body-bytes" in json.loads(body)["error"]
    assert json.loads(log[-1])["status"] == 413 and replica.bodies == []
