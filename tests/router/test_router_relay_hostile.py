"""The router's relay trusts no replica (router/chunked.py,
router/upstream.py, router/proxy.py): a chunked answer that breaks the
framing rules (a bare CR in a chunk's extensions, a trailer line without a
colon, a chunk size no answer has) is cut before its bad bytes reach the
caller, and counted; a replica's own X-LocalModel-* headers never reach the
caller beside the router's; and a malformed request gets 400 with its
access-log line and its count.

The replicas are raw sockets: stand-ins for a hostile replica, writing the
bytes the test gives, split where the test says.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source
from tests.gateway.harness import RawClient

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0)
TURN = {"model": "standin:1b", "messages": [{"role": "user", "content": "x"}]}
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
GOOD = b"5\r\nhello\r\n"

Serve = Callable[..., Awaitable[tuple[RunningRouter, list[str]]]]


async def _hostile_replica(pieces: list[bytes]) -> tuple[asyncio.Server, str]:
    """A stand-in for a hostile replica: reads the request, writes each of
    `pieces` in its own write (so a line can arrive split), keeps the
    connection open until the router drops it."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST"):  # the router's read of /slots: not answered
            writer.close()
            return
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)  # pacing only: lets each piece arrive on its own
        await reader.read()  # until the router closes
        writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def hostile_router() -> AsyncIterator[Callable[[list[bytes]], Awaitable[Any]]]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def make(pieces: list[bytes]) -> tuple[RunningRouter, list[str]]:
        server, url = await _hostile_replica(pieces)

        async def stop_server() -> None:
            server.close()

        cleanups.append(stop_server)
        log: list[str] = []
        running = await start_router(CONFIG, static_source([f"standin:1b={url}"]), log.append)
        cleanups.append(running.stop)
        return running, log

    yield make
    for cleanup in reversed(cleanups):
        await cleanup()


async def _everything(port: int, raw: bytes | None = None) -> bytes:
    """What a caller reads until the router closes its connection."""
    if raw is None:
        client = await RawClient.send(port, "/api/chat", TURN)
        reader, writer = client.reader, client.writer
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
    out = bytearray()
    async with asyncio.timeout(30):
        while chunk := await reader.read(65536):
            out += chunk
    writer.close()
    return bytes(out)


async def _metrics(router: RunningRouter) -> str:
    async with aiohttp.ClientSession() as session, \
            session.get(router.admin_url + "/metrics") as resp:
        return await resp.text()


BAD_ANSWERS = {
    "a bare CR in a chunk's extensions": (b"5;ext\rX-Evil: 1\r\nhello\r\n", b"X-Evil"),
    "a trailer line without a colon": (b"0\r\nNoColonHere\r\n\r\n", b"NoColonHere"),
    "a chunk size no answer has": (b"ffffffffffffffff\r\nhello\r\n", b"ffffffffffffffff"),
}


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
async def test_a_chunked_answer_breaking_the_rules_is_cut_before_its_bad_bytes_and_counted(
        hostile_router: Serve, case: str, split: bool) -> None:
    bad, marker = BAD_ANSWERS[case]
    # The bad line arrives whole, or byte by byte after the good chunk.
    pieces = [HEAD + b"\r\n" + GOOD] + ([bad[i:i + 1] for i in range(len(bad))]
                                        if split else [bad])
    router, log = await hostile_router(pieces)
    seen = await _everything(router.port)
    assert seen.startswith(b"HTTP/1.1 200") and b"hello" in seen
    assert marker not in seen
    assert not seen.endswith(b"0\r\n\r\n")  # cut: never a complete-looking answer
    assert 'localmodel_router_upstream_errors_total{reason="framing"} 1' in \
        await _metrics(router)
    assert json.loads(log[-1])["error"] == "framing"


async def test_a_replicas_own_localmodel_headers_do_not_reach_the_caller(
        hostile_router: Serve) -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            b"x-localmodel-route: spilled; forged\r\nX-LocalModel-Replica: forged\r\n"
            b"X-LocalModel-Caller: forged\r\nX-LocalModel-Served-By: local\r\n\r\n{}")
    router, _ = await hostile_router([head])
    client = await RawClient.send(router.port, "/api/chat", TURN)
    async with asyncio.timeout(30):
        router_head = await client.reader.readuntil(b"\r\n\r\n")
    client.close()
    lines = [line.lower() for line in router_head.split(b"\r\n")]
    assert lines[0].startswith(b"http/1.1 200")
    assert b"forged" not in router_head
    assert [line for line in lines if line.startswith(b"x-localmodel-route:")] == \
        [b"x-localmodel-route: owner"]
    assert sum(line.startswith(b"x-localmodel-replica:") for line in lines) == 1
    assert b"x-localmodel-served-by: local" in lines


@pytest.mark.parametrize("raw", [
    b"POST /api/chat HTTP/1.1\r\nHost: x\r\nX-A: a\nb: c\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /api/chat HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n\r\n{}",
    b"POST /api/chat HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /api/c hat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
], ids=["bare LF in a value", "bare LF ending a line", "bare CR", "a space in the path"])
async def test_a_malformed_request_gets_400_its_access_log_line_and_its_count(
        hostile_router: Serve, raw: bytes) -> None:
    router, log = await hostile_router([])
    seen = await _everything(router.port, raw)
    assert seen.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
    line = json.loads(log[-1])
    assert line["status"] == 400 and line["error"].startswith("malformed request")
    assert 'localmodel_router_requests_total{route="-",status="400"} 1' in \
        await _metrics(router)
