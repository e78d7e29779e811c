"""The operator's reads of a hostile gateway (controller/speed.py `SpeedReader`)
against a real aiohttp server started here: redirects, error statuses, stalls,
oversized and malformed answers and every hostile document of
test_speed_answers.py are counted against that replica (a bad answer, or a
timeout for a stall), and the reader keeps reading everyone else (issue 30).
Replicas on loopback addresses of their own (127.0.0.x, one port) stand for
pod IPs."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from localmodel.controller import speed
from localmodel.controller.speed import (
    READ_BAD_ANSWER,
    READ_OK,
    READ_TIMEOUT,
    ReadCounters,
    SpeedBook,
    SpeedReader,
    SpeedTarget,
)
from localmodel.gateway_contract.speed_answer import READ_MAX_BYTES
from localmodel.speed import SpeedPolicy
from tests.builders import PEER_KEY
from tests.gateway.test_speed_answers import GOOD, HOSTILE

pytestmark = pytest.mark.unit

KEY = PEER_KEY
# READ_TIMEOUT_SECONDS in these tests: room for a good answer in slow pieces on
# a loaded machine (CI shares two cores with builds); a stall lasts until the
# test ends, so it times out whatever this is.
TIMEOUT = 2.0
GUARD_SECONDS = 60  # a hang guard, not a speed target
GOOD_BODY = json.dumps(GOOD).encode()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Gateway:
    """What the hostile gateways saw: requests to the place a redirect names."""

    followed: int = 0
    release: asyncio.Event | None = None  # set at teardown: the stalled handlers end


def body(data: bytes, **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=data, content_type="application/json", headers=headers)
    return handler


def status(code: int) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, body=GOOD_BODY, content_type="application/json")
    return handler


def redirect(code: int, to: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers={"Location": to})
    return handler


def streamed(gw: Gateway, *parts: bytes, pause: float = 0.0, stall: bool = False) -> Handler:
    """A chunked answer (no Content-Length) written in `parts`, `pause` apart;
    `stall`: then nothing more until teardown."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for part in parts:
            await resp.write(part)
            await asyncio.sleep(pause)
        if stall:
            assert gw.release is not None
            await gw.release.wait()
        await resp.write_eof()
        return resp
    return handler


def stalled(gw: Gateway) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert gw.release is not None
        await gw.release.wait()
        return web.Response(body=GOOD_BODY)
    return handler


def serving(data: bytes) -> Callable[[Gateway], Handler]:
    return lambda gw: body(data)


@dataclass(frozen=True)
class Case:
    id: str
    handler: Callable[[Gateway], Handler]
    result: str = READ_BAD_ANSWER


PADDED = GOOD_BODY + b" " * READ_MAX_BYTES  # a good document, then past the bound
CASES = [
    Case("redirect-302-same-host", lambda gw: redirect(302, "/elsewhere")),
    Case("redirect-307-other-address",
         lambda gw: redirect(307, "http://127.0.0.1:1/speed")),
    Case("status-500", lambda gw: status(500)),
    Case("status-404", lambda gw: status(404)),
    Case("stall-before-the-answer", stalled, READ_TIMEOUT),
    Case("stall-in-the-body", lambda gw: streamed(gw, GOOD_BODY[:20], stall=True),
         READ_TIMEOUT),
    Case("announced-past-the-bound", lambda gw: body(PADDED)),
    Case("chunked-past-the-bound", lambda gw: streamed(
        gw, *(PADDED[i:i + 4096] for i in range(0, len(PADDED), 4096)))),
    Case("gzip-bomb", lambda gw: body(gzip.compress(b" " * (16 * 2**20)),
                                      **{"Content-Encoding": "gzip"})),
    *(Case(f"body-{h.id}", serving(h.body)) for h in HOSTILE),
]
FINE = [
    Case("good", lambda gw: body(GOOD_BODY), READ_OK),
    Case("good-in-slow-chunks", lambda gw: streamed(
        gw, GOOD_BODY[:30], GOOD_BODY[30:90], GOOD_BODY[90:], pause=0.05), READ_OK),
    Case("good-at-the-bound", lambda gw: body(
        GOOD_BODY + b" " * (READ_MAX_BYTES - len(GOOD_BODY))), READ_OK),
]


@pytest.fixture(autouse=True)
def small_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(speed, "READ_TIMEOUT_SECONDS", TIMEOUT)
    yield


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[str, Handler], Gateway], Awaitable[int]]]:
    """Start a real server answering GET /speed on each address by its handler
    (one port for all); returns the port."""
    runners: list[web.AppRunner] = []
    gateways: list[Gateway] = []

    async def start(by_ip: dict[str, Handler], gw: Gateway) -> int:
        gw.release = asyncio.Event()
        gateways.append(gw)

        async def speed_(request: web.Request) -> web.StreamResponse:
            host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
            return await by_ip[host](request)

        async def elsewhere(request: web.Request) -> web.StreamResponse:
            gw.followed += 1
            return web.Response(body=GOOD_BODY, content_type="application/json")

        app = web.Application()
        app.router.add_get("/speed", speed_)
        app.router.add_get("/elsewhere", elsewhere)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        runners.append(runner)
        port = 0
        for ip in by_ip:
            site = web.TCPSite(runner, ip, port)
            await site.start()
            port = port or runner.addresses[0][1]
        return port

    yield start
    for gw in gateways:
        assert gw.release is not None
        gw.release.set()
    for runner in runners:
        await runner.cleanup()


def target(i: int, ip: str) -> SpeedTarget:
    return SpeedTarget("ai/chat", i, "n0", f"chat-{i}", f"u{i}", ip, KEY)


@pytest.mark.parametrize("case", CASES + FINE, ids=[c.id for c in CASES + FINE])
async def test_one_read_of_a_hostile_gateway_is_counted_against_it(
    case: Case, serve: Callable[[dict[str, Handler], Gateway], Awaitable[int]],
) -> None:
    gw = Gateway()
    port = await serve({"127.0.0.1": case.handler(gw)}, gw)
    reader = SpeedReader(SpeedBook(), ReadCounters(), lambda: None, port=port)
    async with asyncio.timeout(GUARD_SECONDS), reader.session():
        result, reading = await reader._read_one(target(0, "127.0.0.1"))
    assert result == case.result
    assert (reading is not None) == (case.result == READ_OK)
    assert gw.followed == 0  # a redirect is never followed


async def test_the_reader_keeps_reading_everyone_through_every_hostile_answer(
    serve: Callable[[dict[str, Handler], Gateway], Awaitable[int]],
) -> None:
    """Every case at once, each replica on its own address, under the reader's
    own loop (`run`, as the operator starts it): one round counts each replica
    by its kind, the good ones are read, the loop is still running, and nothing
    reached the event loop's exception handler."""
    gw = Gateway()
    cases = CASES + FINE
    ips = [f"127.0.0.{10 + i}" for i in range(len(cases))]
    port = await serve({ip: c.handler(gw) for ip, c in zip(ips, cases, strict=True)}, gw)
    book = SpeedBook(SpeedPolicy(interval=600, idle_max=600))
    book.retarget([target(i, ip) for i, ip in enumerate(ips)])
    reader = SpeedReader(book, ReadCounters(), lambda: None, port=port)
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    leading = asyncio.Event()
    leading.set()
    task = asyncio.create_task(reader.run(leading))
    reads = reader.counters.reads
    try:
        async with asyncio.timeout(GUARD_SECONDS):
            while sum(reads.value((r,)) for r in speed.RESULTS) < len(cases):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        loop.set_exception_handler(None)
    assert errors == []
    expected = {r: sum(c.result == r for c in cases) for r in speed.RESULTS}
    assert {r: reads.value((r,)) for r in speed.RESULTS} == expected
    read = {b.target.replica for b in book.by_uid.values() if b.reading is not None}
    assert read == {i for i, c in enumerate(cases) if c.result == READ_OK}
    assert gw.followed == 0
