"""The router's side of ownership (router/server.py, gateway_contract/marks.py): it
keeps a session's owner only once the replica accepted the turn, signs the
owned-session mark and its /slots reads for that one replica, and never
passes a caller's mark on. The replica here is an aiohttp server on
loopback, a stand-in for a hostile replica: it refuses what it likes and
records every header it was sent."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.headers import OWNED_SESSION_HEADER
from localmodel.gateway_contract.marks import MARK_HEADER, OWNED, SLOTS, verify
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source

KEY = Ed25519PrivateKey.generate()
SLOTS_DOC = {"total": 1, "busy": 0, "queued": {"foreground": 0, "background": 0},
             "owned_sessions": []}
ANSWER = {"model": "chat", "message": {"role": "assistant", "content": "ok"}, "done": True,
          "prompt_eval_count": 3, "eval_count": 1}


class Replica:
    """A stand-in for a hostile replica: answers every turn with `status`."""

    def __init__(self) -> None:
        self.status = 401
        self.turns: list[dict[str, str]] = []
        self.slots_reads: list[dict[str, str]] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        self.turns.append(dict(request.headers))
        if self.status != 200:
            return web.json_response({"error": "a valid API key is required"},
                                     status=self.status)
        return web.json_response(ANSWER)

    async def slots(self, request: web.Request) -> web.Response:
        self.slots_reads.append(dict(request.headers))
        return web.json_response(SLOTS_DOC)


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Replica, RunningRouter]]:
    replica = Replica()
    app = web.Application()
    app.router.add_post("/api/chat", replica.chat)
    app.router.add_get("/slots", replica.slots)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    replica.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    config = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                          admin_port=0, poll_interval=3600.0, signing_key=KEY)
    router = await start_router(config, static_source([f"team-a/chat={replica.url}"]),
                                lambda line: None)
    yield replica, router
    await router.stop()
    await runner.cleanup()


async def _turn(router: RunningRouter, session: str, **headers: str) -> int:
    body: dict[str, Any] = {"model": "team-a/chat", "stream": False,
                            "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http, http.post(
            router.url + "/api/chat", json=body,
            headers={"X-LocalModel-Session": session, **headers}) as resp:
        await resp.read()
        return resp.status


async def _owned_gauge(router: RunningRouter) -> str:
    async with aiohttp.ClientSession() as http, http.get(router.admin_url + "/metrics") as resp:
        return next(line for line in (await resp.text()).splitlines()
                    if line.startswith("localmodel_router_owned_sessions "))


async def test_a_refused_turn_leaves_no_owner_recorded(
        rig: tuple[Replica, RunningRouter]) -> None:
    replica, router = rig
    for status in (401, 403, 413, 429, 500, 503):
        replica.status = status
        assert await _turn(router, f"refused-{status}") == status
    assert len(router.router.owners) == 0
    assert await _owned_gauge(router) == "localmodel_router_owned_sessions 0"
    replica.status = 200
    assert await _turn(router, "accepted") == 200
    assert len(router.router.owners) == 1
    assert await _owned_gauge(router) == "localmodel_router_owned_sessions 1"


async def test_the_owned_mark_holds_for_its_replica_alone_and_a_callers_mark_is_dropped(
        rig: tuple[Replica, RunningRouter]) -> None:
    replica, router = rig
    replica.status = 200
    assert await _turn(router, "s-1", **{MARK_HEADER: "1.forged"}) == 200
    sent = replica.turns[-1]
    key, mark = sent[OWNED_SESSION_HEADER], sent[MARK_HEADER]
    assert mark != "1.forged"  # the router's own, not the caller's
    public, now = KEY.public_key(), time.time()
    assert verify(public, mark, OWNED, "team-a", replica.url, key, now)
    assert not verify(public, mark, OWNED, "team-b", replica.url, key, now)
    assert not verify(public, mark, OWNED, "team-a", "http://127.0.0.1:1", key, now)
    await router.router.poll()
    read = replica.slots_reads[-1]
    assert verify(public, read[MARK_HEADER], SLOTS, "team-a", replica.url, "", now)
