"""One identity per replica (router/table.py `Replica.id`: namespace/pod):
two namespaces each run a model named `chat`, so both have a pod `chat-0`.
Team-b's is hostile: a stand-in web app on loopback (no real gateway answers
so), standing in for a gateway image the tenant chose, that reports itself
busy and lists team-a's session keys as its own in /slots. Team-a's replicas
are REAL gateways in front of the Ollama stand-in. Nothing team-b's replica
says may move team-a's sessions, and team-a's requests never reach it.
And the static router's start says which models are reached only by their
qualified name (router/table.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway.owned import RouterMarks
from localmodel.gateway_contract.headers import REPLICA_HEADER, ROUTE_HEADER, SESSION_HEADER
from localmodel.router.cli import serve
from localmodel.router.config import RouterConfig
from localmodel.router.owners import Owners
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.session import session_key
from localmodel.router.signing import session_salt
from localmodel.router.static import StaticSource, static_source
from localmodel.router.table import ModelRoute, Replica
from tests.gateway.harness import RigFactory
from tests.gateway.ollama_standin import StandinOllama

# The router's key, known here so the hostile replica can be given the real
# (salted) keys of team-a's sessions: as if they had leaked.
KEY = Ed25519PrivateKey.generate()
CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0,  # the test polls by hand
                      signing_key=KEY)
SESSIONS = [f"team-a-session-{i}" for i in range(8)]


class HostileReplica:
    """A stand-in for a hostile tenant's gateway: /slots says it is full with a
    long queue and owns every session key it was given; /speed says a request
    takes 100 s; every POST is recorded and answered."""

    def __init__(self, owned: list[str]) -> None:
        self.owned = owned
        self.posts: list[dict[str, object]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/slots", self.slots)
        app.router.add_get("/speed", self.speed)
        app.router.add_post("/api/chat", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def slots(self, request: web.Request) -> web.Response:
        return web.json_response({"total": 1, "busy": 1,
                                  "queued": {"foreground": 50, "background": 0},
                                  "owned_sessions": self.owned})

    async def speed(self, request: web.Request) -> web.Response:
        return web.json_response({
            "calibration": {"prefill_tokens_per_second": 1000.0},
            "totals": {"requests": 1, "generated_tokens": 1, "decode_seconds": 100,
                       "prompt_tokens": 0, "prefill_seconds": 0}})

    async def chat(self, request: web.Request) -> web.Response:
        self.posts.append(await request.json())
        return web.json_response({"model": "chat", "done": True,
                                  "message": {"role": "assistant", "content": "mine"}})


@pytest.fixture
async def hostile() -> AsyncIterator[HostileReplica]:
    keys = [session_key(s, {}, session_salt(KEY)) or "" for s in SESSIONS]
    replica = HostileReplica(keys)
    await replica.start()
    yield replica
    assert replica.runner is not None
    await replica.runner.cleanup()


async def _turn(http: aiohttp.ClientSession, router: RunningRouter, model: str,
                session: str) -> tuple[int, str, str]:
    body = {"model": model, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(router.url + "/api/chat", json=body,
                         headers={SESSION_HEADER: session}) as resp:
        await resp.read()
        return resp.status, resp.headers.get(REPLICA_HEADER, ""), resp.headers.get(
            ROUTE_HEADER, "")


async def test_a_hostile_namespaces_pod_of_the_same_name_cannot_move_the_others_sessions(
        make_rig: RigFactory, hostile: HostileReplica) -> None:
    victims = [await make_rig(StandinOllama(tokens=2)) for _ in range(2)]
    team_a = ModelRoute("team-a", "chat", tuple(
        Replica("team-a", f"chat-{i}", rig.url, rig.admin_url) for i, rig in enumerate(victims)))
    team_b = ModelRoute("team-b", "chat", (Replica("team-b", "chat-0", hostile.url,
                                                   hostile.url),))
    log: list[str] = []
    router = await start_router(CONFIG, StaticSource((team_a, team_b)), log.append)
    for i, rig in enumerate(victims):  # team-a's gateways know the router's key and their pod
        rig.gateway.gateway.pipeline.marks = RouterMarks(
            router.router.signing_key.public_key(), "team-a", f"chat-{i}")
    try:
        await router.router.poll()
        watch = router.router.watch
        # What team-b's replica said is its own state only.
        assert watch.state("team-a/chat-0").wait_s == 0.0
        assert (watch.state("team-b/chat-0").wait_s or 0.0) > 1000
        ids = [r.id for r in team_a.replicas]
        salt = router.router.salt  # the router's keys are salted (router/signing.py)
        assert all(watch.owning(ids, session_key(s, {}, salt) or "") == [] for s in SESSIONS)
        # Where team-a's sessions belong: their rendezvous owners with bounded loads,
        # as a router that never heard of team-b places them, in the same order.
        expected = Owners()
        owners = {s: expected.owner("team-a/chat", session_key(s, {}, salt) or "", ids, 0.0)
                  for s in SESSIONS}
        assert set(owners.values()) == set(ids)  # both of team-a's replicas own some
        by_id = dict(zip(ids, victims, strict=True))
        async with aiohttp.ClientSession() as http:
            for turn in range(2):
                for session in SESSIONS:
                    status, replica, route = await _turn(http, router, "team-a/chat", session)
                    assert (status, replica, route) == (200, owners[session], "owner"), (
                        session, turn)
                await router.router.poll()  # the hostile /slots read again between turns
            # Team-b's own model still reaches its replica, named as team-b's.
            status, replica, _ = await _turn(http, router, "team-b/chat", "b-session")
            assert (status, replica) == (200, "team-b/chat-0")
        assert len(hostile.posts) == 1 and hostile.posts[0]["model"] == "chat"
        for rid, rig in by_id.items():
            mine = sorted(session_key(s, {}, salt) or "" for s, o in owners.items() if o == rid)
            assert sorted(rig.gateway.gateway.pipeline.owned.listed()) == mine
        # Metrics and logs name the replica by namespace and pod.
        turns = router.router.metrics.replica_turns
        assert sum(turns.value(("team-a", f"chat-{i}", "owner")) for i in range(2)) == 16
        assert turns.value(("team-b", "chat-0", "owner")) == 1
        assert 'localmodel_router_replica_turns_total{namespace="team-b",pod="chat-0",' \
               'decision="owner"} 1' in router.router.metrics.render()
        docs = [json.loads(line) for line in log]
        assert {d["replica"] for d in docs if d.get("model") == "team-a/chat"} == set(ids)
    finally:
        await router.stop()


async def test_the_static_router_says_at_start_which_models_are_reached_only_qualified(
        capsys: pytest.CaptureFixture[str]) -> None:
    source = static_source(["team-a/chat=http://127.0.0.1:9",
                            "team-b/team-a/chat=http://127.0.0.1:9",
                            "hf.co/u/r:q4=http://127.0.0.1:9"])
    task = asyncio.create_task(serve(CONFIG, source, "static"))
    err = ""
    try:
        for _ in range(1000):  # up to 10 s for the start's lines
            err += capsys.readouterr().err
            if "listening on" in err:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "listening on" in err
    said = [line for line in err.splitlines() if "reaches it only" in line]
    assert said == ["localmodel router: model team-b/team-a/chat: its served name 'team-a/chat' "
                    "reads as namespace/name, so the router reaches it only as "
                    "'team-b/team-a/chat'"]
