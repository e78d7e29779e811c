"""The router's reads of its replicas' /slots and /speed (router/replicas.py)
are read as the operator reads /speed (controller/speed.py): a redirect is
never followed, and an answer announcing more than READ_MAX_BYTES is refused
before its body is read. The replicas are small aiohttp apps: stand-ins for
a hostile replica, and for the address it would send the router's reads to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from localmodel.gateway_contract.speed_answer import READ_MAX_BYTES
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0)
SLOTS = b'{"total": 1, "busy": 0, "queued": {"foreground": 0, "background": 0}}'

App = Callable[[dict[str, web.Response]], Awaitable[tuple[str, list[str]]]]


@pytest.fixture
async def app_at() -> AsyncIterator[App]:
    runners: list[web.AppRunner] = []

    async def serve(answers: dict[str, web.Response]) -> tuple[str, list[str]]:
        hits: list[str] = []

        async def answer(request: web.Request) -> web.StreamResponse:
            hits.append(request.path)
            return answers[request.path]

        app = web.Application()
        for path in answers:
            app.router.add_get(path, answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}", hits

    yield serve
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def router_of() -> AsyncIterator[Callable[[str], Awaitable[RunningRouter]]]:
    started: list[RunningRouter] = []

    async def make(replica: str) -> RunningRouter:
        running = await start_router(CONFIG, static_source([f"m:1b={replica}"]), lambda _: None)
        started.append(running)
        return running

    yield make
    for running in started:
        await running.stop()


async def test_a_replica_redirecting_the_routers_reads_is_not_followed(
        app_at: App, router_of: Callable[[str], Awaitable[RunningRouter]]) -> None:
    elsewhere, hits = await app_at({"/slots": web.Response(body=SLOTS),
                                    "/speed": web.Response(body=b"{}")})
    moved = {path: web.Response(status=302, headers={"Location": elsewhere + path})
             for path in ("/slots", "/speed")}
    replica, _ = await app_at(moved)
    router = await router_of(f"{replica}|{replica}")
    await router.router.poll()
    watch = router.router.watch
    assert hits == []  # the address it pointed to was never read
    assert watch.reads.value(("static", replica, "slots", "status_3xx")) >= 1
    assert watch.reads.value(("static", replica, "speed", "status_3xx")) >= 1
    assert watch.state("static/" + replica).wait_s is None


async def test_an_answer_announcing_more_than_the_bound_is_refused_unread(
        router_of: Callable[[str], Awaitable[RunningRouter]]) -> None:
    """A stand-in on a bare socket announces a longer body than it sends and
    holds the connection: a router that read the body would wait out its
    read's timeout and count the read unreachable, not bad."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (READ_MAX_BYTES + 1, SLOTS))
        await writer.drain()
        await reader.read()  # until the router closes
        writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        router = await router_of(url)
        await router.router.poll()
        watch = router.router.watch
        assert watch.reads.value(("static", url, "slots", "bad")) >= 1
        assert watch.reads.value(("static", url, "slots", "unreachable")) == 0
    finally:
        server.close()
