"""The router holds requests for a sleeping model (router/holding.py): the
real router in-process, in front of a REAL gateway with the Ollama stand-in
(tests/gateway/ollama_standin.py) once the model has a Ready replica, or of a
stand-in closed gateway that answers `503 X-LocalModel-Asleep: 1`.

The route source is the cluster's own reading (router/cluster.py) of
LocalModel and EndpointSlice objects as the watches keep them, told to the
router as ClusterSource tells it (`listen`); only each pod's address is the
test's gateway (the API server's CRD does not carry `spec.idle` yet, so these
objects are not stored there). No timed assertions: every wait is on a
condition, with generous bounds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.headers import (
    ASLEEP,
    ASLEEP_VALUE,
    MAX_WOKE_MS,
    REQUEST_ID_HEADER,
    WOKE_HEADER,
    WOKE_MARK_HEADER,
)
from localmodel.gateway_contract.marks import WOKE, verify, woke_session
from localmodel.gateway_contract.waiting_answer import parse_waiting
from localmodel.router.cluster import ModelEntry, SliceEntry, keep_model, keep_slice, route_table
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.table import RouteTable
from tests.builders import MakeLocalModel
from tests.gateway.harness import RawClient, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0, signing_key=Ed25519PrivateKey.generate())
WAIT = 30.0  # the machine is shared: generous bounds, never timed assertions
Raw = dict[str, Any]


class Cluster:
    """LocalModels and EndpointSlices as the router's watches keep them, read
    by router/cluster.py; each pod's address is replaced by the test's gateway."""

    def __init__(self) -> None:
        self.models: dict[str, ModelEntry] = {}
        self.slices: dict[str, SliceEntry] = {}
        self.urls: dict[str, str] = {}  # pod -> its gateway's URL
        self.listeners: list[Callable[[], None]] = []

    def model(self, body: Raw) -> None:
        entry = keep_model(body)
        self.models[entry.name] = entry
        self._changed()

    def ready(self, model: str, pods: dict[str, str]) -> None:
        """The model's Service's slice: these pods Ready, each at its gateway's URL."""
        self.urls.update(pods)
        self.slices[model] = keep_slice({
            "metadata": {"name": f"{model}-x", "namespace": "ai",
                         "labels": {"kubernetes.io/service-name": model}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [f"10.0.0.{i + 1}"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": pod, "uid": f"uid-{pod}"}}
                          for i, pod in enumerate(pods)]})
        self._changed()

    def routes(self) -> RouteTable:
        table, _ = route_table(self.models.values(), self.slices.values())
        return tuple(replace(r, replicas=tuple(replace(x, url=self.urls[x.name], admin_url=None)
                                               for x in r.replicas)) for r in table)

    def listen(self, callback: Callable[[], None]) -> None:
        self.listeners.append(callback)

    def _changed(self) -> None:
        for callback in self.listeners:
            callback()


def chat(status: Raw | None = None, replicas: int = 1, **idle: Any) -> Raw:
    """The LocalModel ai/chat, serving chat:1b, that may sleep."""
    body = MakeLocalModel("chat", "ai").spec(model="chat:1b", replicas=replicas,
                                             idle={"after": "30m", **idle}).manifest()
    if status is not None:
        body["status"] = status
    return body


Made = tuple[RunningRouter, Cluster]


@pytest.fixture
async def make_router() -> AsyncIterator[Callable[..., Awaitable[Made]]]:
    started: list[RunningRouter] = []

    async def make(model: Raw, **overrides: Any) -> Made:
        cluster = Cluster()
        cluster.model(model)
        running = await start_router(replace(CONFIG, **overrides), cluster, lambda line: None)
        started.append(running)
        return running, cluster

    yield make
    for running in reversed(started):
        await running.stop()


def ask(content: str, **extra: Any) -> Raw:
    return {"model": "chat:1b", "messages": [{"role": "user", "content": content}],
            "stream": False, **extra}


def held(router: RunningRouter) -> int:
    return sum(m.held for m in router.router.holding.waiting())


def counted(router: RunningRouter, result: str) -> float:
    return router.router.metrics.held_total.value((result,))


async def test_held_requests_go_in_arrival_order_when_a_replica_turns_ready(
        make_rig: RigFactory, make_router: Callable[..., Awaitable[Made]]) -> None:
    router, cluster = await make_router(chat({"idle": {"state": "Asleep"}}))
    callers = []
    for n in range(3):
        callers.append(await RawClient.send(router.port, "/api/chat", ask(f"turn {n}")))
        await wait_until(lambda n=n: held(router) == n + 1, timeout=WAIT)  # type: ignore[misc]
    metrics = router.router.metrics.render()
    assert 'localmodel_router_held{namespace="ai",localmodel="chat"} 3' in metrics

    rig = await make_rig(StandinOllama(model="chat:1b", tokens=3), model="chat:1b")
    cluster.ready("chat", {"chat-0": rig.url})  # the wake: a Ready replica
    answers = [await c.response() for c in callers]
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert [g.body["messages"][0]["content"] for g in rig.standin.generations] == [
        "turn 0", "turn 1", "turn 2"]
    assert held(router) == 0 and counted(router, "relayed") == 3
    assert "localmodel_router_held_seconds_count 3" in router.router.metrics.render()


async def test_a_held_request_expires_with_the_reason_and_retry_after(
        make_router: Callable[..., Awaitable[Made]]) -> None:
    reason = "waiting for small-0, where ai/gemma is serving 1 request"
    router, _ = await make_router(chat({"idle": {"state": "Waking", "wake": {"message": reason},
                                                 "lastWake": {"seconds": 40}}}, holdSeconds=1))
    async with aiohttp.ClientSession() as http:
        async with http.post(router.url + "/v1/chat/completions", json=ask("hi")) as openai:
            body = await openai.json()
            assert openai.status == 503
            # 40 s less what it waited (a second, or a little more on a loaded machine)
            assert 30 <= int(openai.headers["Retry-After"]) <= 39
        message = body["error"]["message"]  # within its hold, 1 s (and the body's read)
        assert message.startswith("ai/chat did not wake within 1") and message.endswith(
            f" s: {reason}")
        # The caller's own X-Request-Timeout ends a hold sooner than the model's.
        router2, _ = await make_router(chat({"idle": {"state": "Asleep"}}))
        async with http.post(router2.url + "/api/chat", json=ask("hi"),
                             headers={"X-Request-Timeout": "0.5"}) as ollama:
            assert ollama.status == 503
            assert (await ollama.json())["error"] == "ai/chat did not wake within 0.5 s"
            assert 1 <= int(ollama.headers["Retry-After"]) <= 30  # no wake measured: 30 s less
    assert counted(router, "expired") == 1 and counted(router2, "expired") == 1


async def test_past_the_bound_a_request_is_refused_naming_it(
        make_router: Callable[..., Awaitable[Made]]) -> None:
    router, _ = await make_router(chat(), hold_per_model=2)
    callers = [await RawClient.send(router.port, "/api/chat", ask(str(n))) for n in range(2)]
    await wait_until(lambda: held(router) == 2, timeout=WAIT)
    third = await RawClient.send(router.port, "/api/chat", ask("third"))
    status, headers, body = await third.response()
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"] == ("2 requests already wait for ai/chat to wake "
                                         "(--hold-per-model)")
    assert held(router) == 2 and counted(router, "full") == 1
    for c in callers:
        c.close()


async def test_a_caller_that_leaves_is_dropped_and_counted(
        make_rig: RigFactory, make_router: Callable[..., Awaitable[Made]]) -> None:
    router, cluster = await make_router(chat())
    caller = await RawClient.send(router.port, "/api/chat", ask("gone"))
    await wait_until(lambda: held(router) == 1, timeout=WAIT)
    caller.close()
    await wait_until(lambda: held(router) == 0 and counted(router, "left") == 1, timeout=WAIT)
    assert router.router.places.held == 0  # its place is free again
    rig = await make_rig(StandinOllama(model="chat:1b", tokens=3), model="chat:1b")
    cluster.ready("chat", {"chat-0": rig.url})
    async with aiohttp.ClientSession() as http, \
            http.post(router.url + "/api/chat", json=ask("stays")) as answer:
        assert answer.status == 200
    assert [g.body["messages"][0]["content"] for g in rig.standin.generations] == ["stays"]


async def test_an_off_model_is_refused_at_once_and_a_never_sleeping_one_as_before(
        make_router: Callable[..., Awaitable[Made]]) -> None:
    router, cluster = await make_router(chat({"idle": {"state": "Asleep"}}, replicas=0))
    async with aiohttp.ClientSession() as http:
        async with http.post(router.url + "/api/chat", json=ask("hi")) as off:
            assert off.status == 503 and "Retry-After" not in off.headers
            assert (await off.json())["error"] == "model ai/chat:1b is off (spec.replicas: 0)"
        cluster.model(MakeLocalModel("chat", "ai").spec(model="chat:1b").manifest())
        async with http.post(router.url + "/api/chat", json=ask("hi")) as plain:
            assert plain.status == 503
            assert (await plain.json())["error"] == "model ai/chat:1b has no Ready replica"
    assert held(router) == 0 and router.router.holding.serial == 0  # nothing was ever held


class ClosedGateway:
    """A replica's gateway closed for sleep: it answers every request 503
    asleep before anything reaches its engine, until opened; then it answers
    (as its engine would) and keeps what it answered."""

    def __init__(self) -> None:
        self.open = False
        self.refused = 0
        self.served: list[str] = []
        self.timeouts: list[list[str]] = []  # each served request's X-Request-Timeout headers
        self.woke: list[tuple[str | None, str | None, str | None]] = []  # id, ms, mark

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not self.open:
            self.refused += 1
            return web.json_response({"error": "asleep"}, status=503,
                                     headers={ASLEEP: ASLEEP_VALUE, "Retry-After": "5"})
        self.served.append(body["messages"][0]["content"])
        self.timeouts.append(request.headers.getall("X-Request-Timeout", []))
        self.woke.append((request.headers.get(REQUEST_ID_HEADER), request.headers.get(WOKE_HEADER),
                          request.headers.get(WOKE_MARK_HEADER)))
        return web.json_response({"model": "chat:1b", "done": True,
                                  "message": {"role": "assistant", "content": "awake"}})


async def test_a_replicas_asleep_answer_is_held_and_relayed_once_it_is_open(
        make_router: Callable[..., Awaitable[Made]]) -> None:
    gateway = ClosedGateway()
    app = web.Application()
    app.router.add_post("/api/chat", gateway.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        router, cluster = await make_router(chat({"idle": {"state": "Awake"}}))
        cluster.ready("chat", {"chat-0": f"http://127.0.0.1:{runner.addresses[0][1]}"})
        caller = await RawClient.send(router.port, "/api/chat", ask("while closed"),
                                      {"x-request-timeout": "600"})
        await wait_until(lambda: held(router) == 1 and gateway.refused == 1, timeout=WAIT)
        assert gateway.served == []  # refused before any byte reached its engine
        gateway.open = True  # its close lapsed; the operator writes it awake
        cluster.model(chat({"idle": {"state": "Awake", "lastWake": {"seconds": 1}}}))
        status, _, body = await caller.response()
        assert status == 200 and json.loads(body)["message"]["content"] == "awake"
        assert gateway.served == ["while closed"] and gateway.refused == 1
        [[left]] = gateway.timeouts  # the caller's timeout less the wait, told once
        assert 0 < float(left) < 600
        assert counted(router, "relayed") == 1
        # The wait, signed for this replica and this request: the gateway's
        # ledger keeps it as "waited for a wake" (gateway/owned.py `woke`).
        [(request_id, ms, mark)] = gateway.woke
        assert request_id and ms is not None and 0 <= int(ms) <= MAX_WOKE_MS
        key = CONFIG.signing_key.public_key()
        assert verify(key, mark, WOKE, "ai", "chat-0", woke_session(request_id, int(ms)),
                      time.time())
        assert not verify(key, mark, WOKE, "ai", "chat-1", woke_session(request_id, int(ms)),
                          time.time())
        # A request never held carries no wake, and a caller's own copy is dropped.
        forged = await RawClient.send(router.port, "/api/chat", ask("not held"), {
            WOKE_HEADER: "5000", WOKE_MARK_HEADER: mark or "", REQUEST_ID_HEADER: request_id})
        assert (await forged.response())[0] == 200
        assert gateway.woke[-1] == (request_id, None, None)
    finally:
        await runner.cleanup()


async def test_waiting_long_poll_answers_on_a_change(
        make_router: Callable[..., Awaitable[Made]]) -> None:
    router, _ = await make_router(chat())
    async with aiohttp.ClientSession() as http:
        async def waiting(query: str) -> Any:
            async with http.get(f"{router.admin_url}/waiting{query}") as answer:
                assert answer.status == 200
                return parse_waiting(await answer.read())

        first = await waiting("")
        assert first.models == ()
        poll = asyncio.create_task(waiting(f"?after={first.serial}&wait=30"))
        background = await RawClient.send(router.port, "/api/chat", ask("night batch"),
                                          {"X-Priority": "background"})
        changed = await asyncio.wait_for(poll, WAIT)
        assert changed.serial != first.serial
        [entry] = changed.models
        assert (entry.model, entry.held, entry.foreground) == ("ai/chat", 1, 0)
        fg = await RawClient.send(router.port, "/api/chat", ask("now"))
        await wait_until(lambda: held(router) == 2, timeout=WAIT)
        now = await waiting(f"?after={changed.serial}&wait=0")
        assert [(m.held, m.foreground) for m in now.models] == [(2, 1)]
        async with http.get(f"{router.admin_url}/waiting?after=x&wait=1") as bad:
            assert bad.status == 400
        background.close()
        fg.close()
