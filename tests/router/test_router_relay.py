"""The router's byte relay (router/upstream.py, router/proxy.py): a replica's
answer passes to the caller as it arrives, framed as the caller needs it,
over kept connections, and an answer that breaks, or outlives --deadline, is
cut for the caller, never finished as if whole.

The ordinary replica here is a REAL gateway in front of the Ollama STAND-IN
(tests/gateway/ollama_standin.py, not Ollama). The answers no gateway sends (a
body cut mid-chunk, a body ended by the connection's end, one held until the
test says) come from small aiohttp apps or raw sockets that play the replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source
from tests.gateway.harness import RawClient, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0)
TURN = {"model": "standin:1b", "messages": [{"role": "user", "content": "x"}]}

Serve = Callable[..., Awaitable[tuple[RunningRouter, list[str]]]]
Replica = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def router_for() -> AsyncIterator[Serve]:
    started: list[RunningRouter] = []

    async def make(url: str, **overrides: Any) -> tuple[RunningRouter, list[str]]:
        log: list[str] = []
        config = RouterConfig(**{**CONFIG.__dict__, **overrides})
        running = await start_router(config, static_source([f"standin:1b={url}"]), log.append)
        started.append(running)
        return running, log

    yield make
    for running in reversed(started):
        await running.stop()


@pytest.fixture
async def replica_app() -> AsyncIterator[Replica]:
    """An aiohttp app playing a replica; returns its URL."""
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> str:
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield serve
    for runner in runners:
        await runner.cleanup()


async def _raw_replica(answer: bytes, close: bool = True) -> tuple[asyncio.Server, str]:
    """A replica on a bare socket: reads a request's head and body, writes
    `answer` as it is, then closes the connection if asked."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(one, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_the_head_and_each_line_reach_the_caller_while_the_replica_holds_the_rest(
        router_for: Serve, replica_app: Replica) -> None:
    head_read, go_on = asyncio.Event(), asyncio.Event()

    async def generate(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await head_read.wait()  # the caller has the head before any data is sent
        await response.write(b'{"response":"first","done":false}\n')
        await go_on.wait()  # the rest only once the caller has read the first line
        await response.write(b'{"response":"","done":true,"prompt_eval_count":4,'
                             b'"eval_count":2}\n')
        return response

    app = web.Application()
    app.router.add_post("/api/generate", generate)
    router, log = await router_for(await replica_app(app))
    client = await RawClient.send(router.port, "/api/generate", {**TURN, "prompt": "x"})
    try:
        async with asyncio.timeout(5):
            head = await client.reader.readuntil(b"\r\n\r\n")
        head_read.set()
        assert head.startswith(b"HTTP/1.1 200") and b"X-LocalModel-Route: owner" in head
        async with asyncio.timeout(5):
            while b"first" not in await client.reader.readline():
                pass
        go_on.set()
        async with asyncio.timeout(5):
            rest = b""
            while b"0\r\n\r\n" not in rest:
                rest += await client.reader.read(4096)
    finally:
        client.close()
    assert b'"done":true' in rest
    await wait_until(lambda: len(log) == 1)
    doc = json.loads(log[0])
    assert (doc["status"], "error" in doc) == (200, False)
    # The accounting read from the relayed tail: 4 prompt + 2 generated tokens.
    assert router.router.book.held("static/standin:1b\0" + doc["session"]) == {
        doc["replica"]: 6}


async def test_one_kept_connection_carries_turn_after_turn_to_a_replica(
        router_for: Serve, replica_app: Replica) -> None:
    peers: list[Any] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.json()
        if body.get("stream") is False:
            return web.json_response({"message": {"content": "whole"}, "done": True})
        response = web.StreamResponse()
        await response.prepare(request)
        for word in (b"a", b"b", b"c"):
            await response.write(b'{"message":{"content":"%b"},"done":false}\n' % word)
        await response.write(b'{"done":true}\n')
        return response

    app = web.Application()
    app.router.add_post("/api/chat", chat)
    router, _ = await router_for(await replica_app(app))
    async with aiohttp.ClientSession() as http:
        answers = []
        for stream in (True, False, True, False):
            async with http.post(router.url + "/api/chat", json={**TURN, "stream": stream}) as r:
                assert r.status == 200
                answers.append(await r.read())
    assert answers[0].count(b"\n") == 4 and answers[2] == answers[0]
    assert json.loads(answers[1]) == {"message": {"content": "whole"}, "done": True}
    assert len(peers) == 4 and len(set(peers)) == 1, peers


async def test_a_kept_connection_the_replica_closed_is_not_used_again(
        router_for: Serve, make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(tokens=3), idle_timeout=0.2)
    router, log = await router_for(rig.url)
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(router.url + "/api/chat", json=TURN) as resp:
                assert resp.status == 200
                await resp.read()
            await asyncio.sleep(0.6)  # the gateway closes the router's idle connection
    assert [json.loads(line)["status"] for line in log] == [200, 200]
    assert router.router.metrics.upstream_errors.value(("connect",)) == 0


async def test_an_answer_the_replica_cuts_mid_chunk_is_cut_for_the_caller(
        router_for: Serve) -> None:
    server, url = await _raw_replica(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        b"10\r\n{\"response\":\"a\"}\r\n20\r\n{\"respo")
    async with server:
        router, log = await router_for(url)
        client = await RawClient.send(router.port, "/api/generate", {**TURN, "prompt": "x"})
        async with asyncio.timeout(5):
            received = await client.reader.read()  # to the connection's end
        client.close()
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert b'{"response":"a"}' in received and not received.endswith(b"0\r\n\r\n")
    await wait_until(lambda: len(log) == 1)
    assert json.loads(log[0])["error"] == "stream"
    assert router.router.metrics.upstream_errors.value(("stream",)) == 1


async def test_an_answer_ended_by_its_connection_reaches_the_caller_in_chunks(
        router_for: Serve) -> None:
    lines = b'{"response":"a","done":false}\n{"done":true,"prompt_eval_count":1,"eval_count":1}\n'
    server, url = await _raw_replica(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n" + lines)
    async with server:
        router, log = await router_for(url)
        async with aiohttp.ClientSession() as http, http.post(
                router.url + "/api/generate", json={**TURN, "prompt": "x"}) as resp:
            assert resp.headers["Transfer-Encoding"] == "chunked"
            assert await resp.read() == lines
    await wait_until(lambda: len(log) == 1)
    assert "error" not in json.loads(log[0])


async def test_an_http_1_0_caller_gets_the_data_alone_and_the_connections_end(
        router_for: Serve, make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(tokens=4))
    router, _ = await router_for(rig.url)
    body = json.dumps({**TURN, "prompt": "x"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(b"POST /api/generate HTTP/1.0\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    async with asyncio.timeout(10):
        received = await reader.read()  # to the connection's end
    writer.close()
    head, _, data = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"transfer-encoding" not in head.lower()
    docs = [json.loads(line) for line in data.splitlines()]
    assert len(docs) == 5 and docs[-1]["done"] is True


async def test_a_slow_caller_gets_every_byte_of_a_large_answer(
        router_for: Serve, replica_app: Replica) -> None:
    block = bytes(range(256)) * 256  # 64 KiB
    blocks = 64  # 4 MiB: past every socket buffer between the replica and the caller

    async def generate(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(blocks):
            await response.write(block)
        return response

    app = web.Application()
    app.router.add_post("/api/generate", generate)
    router, log = await router_for(await replica_app(app))
    digest = hashlib.sha256()
    size = 0
    async with aiohttp.ClientSession() as http, http.post(
            router.url + "/api/generate", json={**TURN, "prompt": "x"}) as resp:
        async for chunk in resp.content.iter_chunked(256 * 1024):
            digest.update(chunk)
            size += len(chunk)
            await asyncio.sleep(0.01)  # a caller slower than the replica
    assert size == blocks * len(block)
    assert digest.hexdigest() == hashlib.sha256(block * blocks).hexdigest()
    await wait_until(lambda: len(log) == 1)
    assert json.loads(log[0])["status"] == 200


async def test_an_answer_past_the_deadline_is_cut_and_the_replica_let_go(
        router_for: Serve, make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.05, tokens=200))
    router, log = await router_for(rig.url, deadline=0.5)
    client = await RawClient.send(router.port, "/api/generate", {**TURN, "prompt": "x"})
    async with asyncio.timeout(10):
        received = await client.reader.read()
    client.close()
    assert received.startswith(b"HTTP/1.1 200") and not received.endswith(b"0\r\n\r\n")
    gen = rig.standin.generations[0]
    await wait_until(lambda: gen.stopped is not None, timeout=5)
    assert gen.stop_reason == "client_gone" and gen.tokens < 200
    await wait_until(lambda: len(log) == 1)
    assert json.loads(log[0])["error"] == "deadline"


async def test_a_replica_that_does_not_answer_is_a_502_in_the_apis_shape(
        router_for: Serve) -> None:
    server, url = await _raw_replica(b"NOT HTTP\r\n\r\n")
    async with server:
        router, log = await router_for(url)
        async with aiohttp.ClientSession() as http, http.post(
                router.url + "/v1/chat/completions", json=TURN) as resp:
            assert resp.status == 502
            assert "did not answer" in (await resp.json())["error"]["message"]
    await wait_until(lambda: len(log) == 1)
    assert router.router.metrics.upstream_errors.value(("connect",)) == 1


async def _replica_that_closes(after: int) -> tuple[asyncio.Server, str, list[int]]:
    """A replica on a bare socket that answers the first `after` POSTs of
    each connection and closes the connection, unanswered, at the next; the
    list counts the POSTs each connection read (the router's reads of
    /slots, on connections of their own, are refused and not counted)."""
    per_connection: list[int] = []
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n"
              b'{"done":true}')

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = -1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"POST "):
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                if index < 0:
                    per_connection.append(0)
                    index = len(per_connection) - 1
                per_connection[index] += 1
                if per_connection[index] > after:
                    return
                writer.write(answer)
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", per_connection


async def test_a_kept_connection_closed_unanswered_is_tried_once_more_on_a_new_one(
        router_for: Serve) -> None:
    server, url, per_connection = await _replica_that_closes(after=1)
    async with server:
        router, log = await router_for(url)
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(router.url + "/api/chat", json=TURN) as resp:
                    assert (resp.status, await resp.read()) == (200, b'{"done":true}')
    # The second request went out on the kept connection, found it closed
    # unanswered, and was answered on a new one.
    assert per_connection == [2, 1]
    assert [json.loads(line)["status"] for line in log] == [200, 200]


async def test_a_new_connection_closed_unanswered_is_a_502_not_a_retry(
        router_for: Serve) -> None:
    server, url, per_connection = await _replica_that_closes(after=0)
    async with server:
        router, _ = await router_for(url)
        async with aiohttp.ClientSession() as http, http.post(
                router.url + "/api/chat", json=TURN) as resp:
            assert resp.status == 502
    assert per_connection == [1]
    assert router.router.metrics.upstream_errors.value(("connect",)) == 1
