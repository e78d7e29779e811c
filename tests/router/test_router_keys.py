"""Keys at the front door: the router's listings (`/v1/models`, `/api/tags`)
show a keyed model only to a caller whose key the model's gateway accepts
(router/keyed.py), open models to everyone, and no error names a keyed model;
`POST /api/show` through the router is bounded and, on a keyed model, needs
the key.

REAL gateways run in-process (team-a's and team-b's with their own keys
files, one without keys), each in front of the Ollama STAND-IN
(tests/gateway/ollama_standin.py, not Ollama); callers are the official
`openai` and `ollama` clients. Where a replica must misbehave, an aiohttp
server on loopback is a STAND-IN FOR A HOSTILE REPLICA (a tenant chooses its
gateway's image): it records what the router sends it and answers what it
likes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import openai
import pytest
from aiohttp import web

from localmodel.engines.ollama import SHOW_PATH, TAGS_PATH
from localmodel.gateway.keys import digest_of
from localmodel.gateway_contract.keys import KEY_CHECK_PATH, KEY_NONCE_HEADER, KEY_PROOF_HEADER
from localmodel.router import keyed
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source
from tests.gateway.harness import RawClient, Rig, RigFactory
from tests.gateway.ollama_standin import StandinOllama

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0)
A_KEY = "lmk-team-a-0d9c4f1b2e7a6385"
B_KEY = "lmk-team-b-9e8f7a6b5c4d3e21"
HI = [{"role": "user", "content": "hi"}]

Routers = Callable[[list[str]], Awaitable[RunningRouter]]


@pytest.fixture
async def make_router() -> AsyncIterator[Routers]:
    started: list[RunningRouter] = []

    async def make(replicas: list[str]) -> RunningRouter:
        running = await start_router(CONFIG, static_source(replicas), lambda line: None)
        started.append(running)
        return running

    yield make
    for running in reversed(started):
        await running.stop()


def _keys_file(tmp_path: Path, team: str, key: str) -> str:
    path = tmp_path / f"{team}.json"
    path.write_text(json.dumps({"keys": [{"caller": team, "sha256": digest_of(key)}]}))
    return str(path)


async def _teams(make_rig: RigFactory, tmp_path: Path) -> tuple[Rig, Rig, Rig]:
    """team-a's keyed model, team-b's keyed model, and an open one."""
    a = await make_rig(StandinOllama(model="alpha:1b", tokens=3), model="alpha:1b",
                       keys_file=_keys_file(tmp_path, "team-a", A_KEY))
    b = await make_rig(StandinOllama(model="beta:1b", tokens=3), model="beta:1b",
                       keys_file=_keys_file(tmp_path, "team-b", B_KEY))
    o = await make_rig(StandinOllama(model="open:1b", tokens=3), model="open:1b")
    return a, b, o


def _table(a: Rig, b: Rig, o: Rig) -> list[str]:
    return [f"team-a/alpha:1b={a.url}|{a.admin_url};keys",
            f"team-b/beta:1b={b.url}|{b.admin_url};keys",
            f"team-c/open:1b={o.url}|{o.admin_url}"]


async def _openai_ids(url: str, key: str) -> list[str]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        return sorted([m.id async for m in client.models.list()])


async def _ollama_names(url: str, key: str | None) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    tags = await ollama.AsyncClient(host=url, headers=headers).list()
    return sorted(m.model or "" for m in tags.models)


async def _raw_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_a_key_sees_its_own_keyed_model_and_the_open_ones_not_another_teams(
        make_rig: RigFactory, make_router: Routers, tmp_path: Path) -> None:
    a, b, o = await _teams(make_rig, tmp_path)
    router = await make_router(_table(a, b, o))
    assert await _openai_ids(router.url, A_KEY) == ["alpha:1b", "open:1b"]
    assert await _ollama_names(router.url, A_KEY) == ["alpha:1b", "open:1b"]
    assert await _openai_ids(router.url, B_KEY) == ["beta:1b", "open:1b"]
    assert await _ollama_names(router.url, B_KEY) == ["beta:1b", "open:1b"]
    assert await _openai_ids(router.url, "lmk-not-a-key") == ["open:1b"]
    # No engine was asked anything to answer a listing.
    assert a.standin.requests == b.standin.requests == o.standin.requests == []


async def test_without_a_key_the_listings_name_no_keyed_model_nor_count_one(
        make_rig: RigFactory, make_router: Routers, tmp_path: Path) -> None:
    a, b, o = await _teams(make_rig, tmp_path)
    router = await make_router(_table(a, b, o))
    assert await _ollama_names(router.url, None) == ["open:1b"]
    for path in ("/v1/models", TAGS_PATH):
        status, body = await _raw_get(router.url + path)
        assert status == 200
        assert b"alpha" not in body and b"beta" not in body and b"team-" not in body
        doc = json.loads(body)
        assert len(doc.get("data", doc.get("models"))) == 1
    # Nor do the errors that list models: an unknown model, a missing one.
    for body in ({"model": "nope:1b", "messages": HI}, {"messages": HI}):
        status, _, answer = await (await RawClient.send(router.port, "/api/chat", body)).response()
        assert status in (400, 404)
        assert b"open:1b" in answer and b"alpha" not in answer and b"beta" not in answer


async def test_a_keyed_model_without_its_key_gets_the_gateways_401_through_the_router(
        make_rig: RigFactory, make_router: Routers, tmp_path: Path) -> None:
    a, b, o = await _teams(make_rig, tmp_path)
    router = await make_router(_table(a, b, o))
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=B_KEY,
                                  max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="alpha:1b", messages=HI)  # type: ignore[arg-type]
    with pytest.raises(ollama.ResponseError) as refused:
        await ollama.AsyncClient(host=router.url).chat(model="team-a/alpha:1b", messages=HI)
    assert refused.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as show:
        await ollama.AsyncClient(host=router.url).show("alpha:1b")
    assert show.value.status_code == 401
    assert a.standin.requests == []
    good = ollama.AsyncClient(host=router.url, headers={"Authorization": f"Bearer {A_KEY}"})
    assert (await good.chat(model="alpha:1b", messages=HI)).message.content
    assert (await good.show("alpha:1b")) is not None


async def test_an_oversize_show_is_refused_by_the_routers_bounds(
        make_rig: RigFactory, make_router: Routers, tmp_path: Path) -> None:
    a, b, o = await _teams(make_rig, tmp_path)
    router = await make_router(_table(a, b, o))
    limit = CONFIG.bounds.max_messages
    body = {"model": "open:1b", "messages": [{}] * (limit + 1)}
    status, _, answer = await (await RawClient.send(router.port, SHOW_PATH, body)).response()
    assert status == 413
    assert json.loads(answer)["error"] == (f"messages has {limit + 1} entries, over the limit of "
                                           f"{limit} (--max-messages)")
    assert o.standin.requests == []
    status, _, _ = await (await RawClient.send(router.port, SHOW_PATH,
                                               {"model": "open:1b"})).response()
    assert status == 200
    assert [path for path, _ in o.standin.requests] == [SHOW_PATH]


# ---- hostile replicas ------------------------------------------------------------------


class HostileReplica:
    """A STAND-IN FOR A HOSTILE REPLICA: records every request's headers and
    answers the key check with `status` (and a Location, to test redirects),
    anything else with 404."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.target = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.any)
        return app

    async def any(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers)))
        if request.path != KEY_CHECK_PATH:  # /slots, /speed: not this test's business
            return web.Response(status=404)
        headers = {"Location": self.target} if 300 <= self.status < 400 else None
        return web.Response(status=self.status, headers=headers)


@pytest.fixture
async def hostile() -> AsyncIterator[Callable[[int], Awaitable[tuple[HostileReplica, str]]]]:
    runners: list[web.AppRunner] = []

    async def start(status: int) -> tuple[HostileReplica, str]:
        replica = HostileReplica(status)
        runner = web.AppRunner(replica.app(), shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return replica, f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_the_key_never_reaches_the_replica_asked_about_it(
        hostile: Any, make_router: Routers) -> None:
    replica, url = await hostile(204)
    router = await make_router([f"team-b/evil:1b={url};keys"])
    for _ in range(2):
        assert await _openai_ids(router.url, A_KEY) == ["evil:1b"]
    checks = [h for path, h in replica.seen if path == KEY_CHECK_PATH]
    assert len(checks) == 1  # the second listing read the router's cache
    digest = hashlib.sha256(A_KEY.encode()).hexdigest()
    for _, headers in replica.seen:
        for value in headers.values():
            assert A_KEY not in value and digest not in value
    assert "Authorization" not in checks[0]
    assert len(checks[0][KEY_NONCE_HEADER]) == 32 and len(checks[0][KEY_PROOF_HEADER]) == 64


async def test_a_replica_that_cannot_answer_leaves_its_model_out(
        hostile: Any, make_router: Routers) -> None:
    sink, sink_url = await hostile(204)  # where a redirect points: it must not be followed
    table = []
    for status in (200, 302, 403, 404, 500):
        replica, url = await hostile(status)
        replica.target = sink_url + KEY_CHECK_PATH
        table.append(f"team-b/m{status}:1b={url};keys")
    table.append("team-b/gone:1b=http://127.0.0.1:9;keys")  # nothing listens there
    router = await make_router(table)
    assert await _openai_ids(router.url, A_KEY) == []
    assert await _ollama_names(router.url, A_KEY) == []
    assert sink.seen == []
    # Each model was asked once (no answer: not asked again within the TTL), and counted.
    status, metrics = await _raw_get(router.admin_url + "/metrics")
    assert status == 200
    assert 'localmodel_router_key_checks_total{answer="none"} 6' in metrics.decode()


class HangingReplica:
    """A STAND-IN FOR A HOSTILE REPLICA that never answers the key check;
    counts the checks, and reads how many the router has in flight (same loop)."""

    def __init__(self) -> None:
        self.total = 0
        self.most = 0  # the router's checks in flight, the most seen as one arrived
        self.router: RunningRouter | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(KEY_CHECK_PATH, self.hang)
        return app

    async def hang(self, request: web.Request) -> web.Response:
        self.total += 1
        if self.router is not None:
            self.most = max(self.most, self.router.router.keys.checking)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_hanging_replica_costs_a_bounded_number_of_checks_and_is_left_out(
        make_rig: RigFactory, make_router: Routers, tmp_path: Path) -> None:
    a, b, o = await _teams(make_rig, tmp_path)
    hanging = HangingReplica()
    # A check the router gives up closes its connection, which ends the handler.
    runner = web.AppRunner(hanging.app(), handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        many = [f"team-h/h{i}:1b={url};keys" for i in range(keyed.MAX_CHECKS + 8)]
        router = await make_router([*_table(a, b, o), *many])
        hanging.router = router
        listing = _openai_ids(router.url, A_KEY)
        assert await asyncio.wait_for(listing, 60) == ["alpha:1b", "open:1b"]
        assert 0 < hanging.total <= keyed.MAX_CHECKS
        assert 0 < hanging.most <= keyed.CONCURRENCY
        asked = hanging.total
        # The models that did not answer are not asked again within the TTL.
        assert await asyncio.wait_for(_openai_ids(router.url, B_KEY), 60) == ["beta:1b",
                                                                               "open:1b"]
        assert hanging.total - asked <= keyed.MAX_CHECKS - 1
    finally:
        await runner.cleanup()
