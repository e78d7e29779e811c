"""The door at a REAL gateway (in-process, on loopback) in front of the Ollama
STAND-IN (not Ollama): the operator's signed `POST /yield` closes it only
when nothing is in flight or queued and it has been idle long enough (a
stream in flight gets 409, the same call after the stream ended gets 200);
a closed gateway answers every slot request 503 asleep before the engine
sees a byte (the stand-in's own count proves it), while listings, probes and
its own endpoints still answer; the close is a lease that lapses; `reopen`
opens; a call without the operator's mark for this pod and this body, or a
replayed one, changes nothing. /speed's activity counts slot routes only.
The router's signed wake wait reaches the ledger; a caller's does not."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract import (
    LEDGER_PATH,
    SLOTS_PATH,
    SPEED_PATH,
    YIELD_PATH,
    client_api,
)
from localmodel.gateway_contract.headers import ASLEEP, ASLEEP_VALUE, WOKE_HEADER, WOKE_MARK_HEADER
from localmodel.gateway_contract.marks import (
    MARK_HEADER,
    OWNED,
    public_key_text,
    sign,
    sign_woke,
    sign_yield,
    yield_session,
)
from tests.gateway.harness import RawClient, Rig, RigFactory, wait_until
from tests.gateway.ollama_standin import Generation, StandinOllama

OPERATOR = Ed25519PrivateKey.generate()  # the key the operator and the router share
HERE = ("team-a", "chat-0")  # the replica's namespace and pod, as the operator renders them
CHAT = {"model": "standin:1b", "messages": [{"role": "user", "content": "hi"}]}
OPENAI_CHAT = {"model": "standin:1b", "messages": [{"role": "user", "content": "hi"}]}
SLOT_CALLS = (("/api/chat", CHAT), ("/api/generate", {"model": "standin:1b", "prompt": "hi"}),
              ("/api/embed", {"model": "standin:1b", "input": "hi"}),
              ("/v1/chat/completions", OPENAI_CHAT),
              ("/v1/completions", {"model": "standin:1b", "prompt": "hi"}),
              ("/v1/embeddings", {"model": "standin:1b", "input": "hi"}))
LISTINGS = (client_api.TAGS_PATH, client_api.PS_PATH, client_api.VERSION_PATH, "/v1/models",
            "/readyz", "/healthz", SLOTS_PATH)
SHOW = client_api.SHOW_PATH


class HeldStandin(StandinOllama):
    """The stand-in, with every generation held before its first token until
    the test lets it go (`go`), so a stream is in flight as long as a test needs."""

    def __init__(self) -> None:
        super().__init__(token_delay=0.0, tokens=3)
        self.go = asyncio.Event()

    async def _produce(self, gen: Generation, n: int, emit: Any) -> str:
        await self.go.wait()
        return await super()._produce(gen, n, emit)


async def _rig(make_rig: RigFactory, standin: StandinOllama | None = None,
               **overrides: Any) -> Rig:
    return await make_rig(standin, router_key=public_key_text(OPERATOR), pod_namespace=HERE[0],
                          pod_name=HERE[1], **overrides)


_last_second = [0]


def _mark(reason: str, idle_at_least: int, key: Ed25519PrivateKey = OPERATOR,
          where: tuple[str, str] = HERE, at: float | None = None) -> str:
    """A fresh yield mark: each second used once, since a gateway takes a mark once."""
    if at is None:
        at = max(time.time(), _last_second[0] + 1.0)
        _last_second[0] = int(at)
    return sign_yield(key, *where, reason, idle_at_least, at)


async def _yield(http: aiohttp.ClientSession, rig: Rig, reason: str, idle_at_least: int = 0,
                 mark: str | None = None, body: Any = None) -> tuple[int, dict[str, Any]]:
    if body is None:
        body = {"reason": reason, "idle_at_least": idle_at_least}
    headers = {MARK_HEADER: mark if mark is not None else _mark(reason, idle_at_least)}
    async with http.post(rig.admin_url + YIELD_PATH, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def _activity(http: aiohttp.ClientSession, rig: Rig) -> dict[str, Any]:
    async with http.get(rig.admin_url + SPEED_PATH) as resp:
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
        return doc["activity"]  # type: ignore[no-any-return]


async def test_a_close_is_refused_while_a_stream_is_in_flight_and_accepted_once_it_ended(
        make_rig: RigFactory) -> None:
    standin = HeldStandin()
    rig = await _rig(make_rig, standin)
    stream = await RawClient.send(rig.port, "/api/chat", {**CHAT, "stream": True})
    await wait_until(lambda: standin.active == 1, timeout=30)
    async with aiohttp.ClientSession() as http:
        status, body = await _yield(http, rig, "yield", 0)
        assert (status, body) == (409, {"in_flight": 1, "queued": 0, "idle_seconds": 0.0})
        assert not rig.gateway.gateway.door.closed
        standin.go.set()
        answer_status, _, answer = await stream.response()
        stream.close()
        assert answer_status == 200 and b'"done":true' in answer  # the stream ran to its end
        await wait_until(lambda: rig.gateway.gateway.door.in_flight == 0, timeout=30)
        # Not idle for an hour: refused with the counts.
        status, body = await _yield(http, rig, "sleep", 3600)
        assert status == 409 and (body["in_flight"], body["queued"]) == (0, 0)
        assert 0 <= body["idle_seconds"] < 3600
        assert await _yield(http, rig, "yield", 0) == (200, {"closed": True,
                                                             "lease_seconds": 60.0})
        assert (await _activity(http, rig))["closed"] is True
        metrics = await (await http.get(rig.admin_url + "/metrics")).text()
    assert "localmodel_gateway_closed 1" in metrics
    assert 'localmodel_gateway_yield_calls_total{reason="yield",result="refused"} 1' in metrics
    assert 'localmodel_gateway_yield_calls_total{reason="sleep",result="refused"} 1' in metrics
    assert 'localmodel_gateway_yield_calls_total{reason="yield",result="accepted"} 1' in metrics
    assert [g.stop_reason for g in standin.generations] == ["done"]


async def test_a_queued_request_refuses_a_close(make_rig: RigFactory) -> None:
    standin = HeldStandin()
    rig = await _rig(make_rig, standin)
    first = await RawClient.send(rig.port, "/api/chat", {**CHAT, "stream": True})
    second = await RawClient.send(rig.port, "/api/chat", {**CHAT, "stream": True})
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 1, timeout=30)
    async with aiohttp.ClientSession() as http:
        assert await _yield(http, rig, "yield", 0) == (
            409, {"in_flight": 2, "queued": 1, "idle_seconds": 0.0})
        standin.go.set()
        for client in (first, second):
            assert (await client.response())[0] == 200
            client.close()


async def test_a_closed_gateway_answers_asleep_before_the_engine_sees_a_byte(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    async with aiohttp.ClientSession() as http:
        assert (await _yield(http, rig, "sleep", 0))[0] == 200
        for path, body in SLOT_CALLS:
            async with http.post(rig.url + path, json=body) as resp:
                assert resp.status == 503, path
                assert resp.headers[ASLEEP] == ASLEEP_VALUE
                assert int(resp.headers["Retry-After"]) >= 1
                doc = await resp.json()
            message = doc["error"]["message"] if path.startswith("/v1/") else doc["error"]
            assert "asleep" in message and "router" in message, doc
        assert rig.standin.requests == []  # the engine saw none of them
        for path in LISTINGS:  # listings, probes and the gateway's own answers still answer
            async with http.get(rig.url + path) as resp:
                assert resp.status == 200, path
        async with http.post(rig.url + SHOW, json={"model": "standin:1b"}) as resp:
            assert resp.status == 200
        activity = await _activity(http, rig)
        assert (activity["in_flight"], activity["arrived"], activity["closed"]) == (
            0, len(SLOT_CALLS), True)
        ledger = (await (await http.get(rig.admin_url + LEDGER_PATH)).json())["entries"]
    slot_paths = {path for path, _ in SLOT_CALLS}
    asleep = [e["route"] for e in ledger if e["outcome"] == "asleep"]
    assert sorted(asleep) == sorted(slot_paths)
    assert all(e["outcome"] == "ok" for e in ledger if e["route"] not in slot_paths)


async def test_the_lease_reopens_a_gateway_no_one_renewed(make_rig: RigFactory) -> None:
    rig = await _rig(make_rig, yield_lease=0.5)
    async with aiohttp.ClientSession() as http:
        assert await _yield(http, rig, "yield", 0) == (200, {"closed": True,
                                                             "lease_seconds": 0.5})
        # Nobody renews: a slot request is served again once the lease ran out.
        statuses: list[int] = []
        while not statuses or statuses[-1] != 200:
            async with http.post(rig.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
                statuses.append(resp.status)
            assert len(statuses) < 3000, "the lease never lapsed"
            await asyncio.sleep(0.02)
    assert set(statuses[:-1]) <= {503}
    assert len(rig.standin.requests) == 1  # only the one it served after reopening


async def test_reopen_opens_at_once(make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    async with aiohttp.ClientSession() as http:
        assert (await _yield(http, rig, "sleep", 0))[0] == 200
        assert await _yield(http, rig, "reopen", 0) == (200, {"closed": False})
        async with http.post(rig.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200
        assert (await _activity(http, rig))["closed"] is False


async def test_a_close_without_the_operators_mark_for_this_pod_and_call_changes_nothing(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    now = time.time()
    stranger = Ed25519PrivateKey.generate()
    refused = {
        "unsigned": "",
        "a stranger's key": _mark("sleep", 0, key=stranger),
        "another pod": _mark("sleep", 0, where=("team-a", "chat-1")),
        "another namespace": _mark("sleep", 0, where=("team-b", "chat-0")),
        "another purpose": sign(OPERATOR, OWNED, *HERE, yield_session("sleep", 0), now),
        "another body": _mark("sleep", 1800),
        "expired": _mark("sleep", 0, at=now - 600),
        "from the future": _mark("sleep", 0, at=now + 600),
    }
    async with aiohttp.ClientSession() as http:
        for why, mark in refused.items():
            status, body = await _yield(http, rig, "sleep", 0, mark=mark)
            assert status == 403, why
            assert "signed mark" in body["error"]
            assert not rig.gateway.gateway.door.closed, why
        # A valid mark works once; the same mark again is a replay.
        valid = _mark("sleep", 0)
        assert (await _yield(http, rig, "sleep", 0, mark=valid))[0] == 200
        assert (await _yield(http, rig, "reopen", 0))[0] == 200
        assert (await _yield(http, rig, "sleep", 0, mark=valid))[0] == 403
        assert (await _yield(http, rig, "sleep", 0, mark="0" + valid))[0] == 403  # respelled
        assert not rig.gateway.gateway.door.closed
        # A bad body is refused before any mark is looked at.
        status, _ = await _yield(http, rig, "sleep", mark=valid, body={"reason": "nap"})
        assert status == 400
        async with http.post(rig.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200
        async with http.post(rig.url + YIELD_PATH, json={"reason": "sleep", "idle_at_least": 0},
                             headers={MARK_HEADER: _mark("sleep", 0)}) as resp:
            assert resp.status in (404, 405)  # not on the inference port the Service exposes
        metrics = await (await http.get(rig.admin_url + "/metrics")).text()
    forbidden = len(refused) + 2
    assert (f'localmodel_gateway_yield_calls_total{{reason="sleep",result="forbidden"}} '
            f"{forbidden}") in metrics
    assert 'localmodel_gateway_yield_calls_total{reason="unknown",result="bad_request"} 1' \
        in metrics


async def test_without_the_router_key_no_close_is_possible(make_rig: RigFactory) -> None:
    rig = await make_rig(pod_namespace=HERE[0], pod_name=HERE[1])
    async with aiohttp.ClientSession() as http:
        assert (await _yield(http, rig, "sleep", 0))[0] == 403
    assert not rig.gateway.gateway.door.closed


async def test_activity_counts_slot_requests_and_pollers_keep_nothing_awake(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    door = rig.gateway.gateway.door
    async with aiohttp.ClientSession() as http:
        async with http.post(rig.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200
        before = await _activity(http, rig)
        assert (before["in_flight"], before["queued"], before["arrived"]) == (0, 0, 1)
        last_busy = door._last_busy
        for _ in range(3):
            for path in LISTINGS:
                async with http.get(rig.url + path) as resp:
                    assert resp.status == 200
            async with http.post(rig.url + SHOW, json={"model": "standin:1b"}) as resp:
                assert resp.status == 200
            for path in (SPEED_PATH, "/metrics", LEDGER_PATH, "/healthz"):
                async with http.get(rig.admin_url + path) as resp:
                    assert resp.status == 200
        after = await _activity(http, rig)
    assert after["arrived"] == 1 and door._last_busy == last_busy
    assert after["idle_seconds"] >= before["idle_seconds"]


async def test_the_routers_signed_wake_wait_reaches_the_ledger_and_a_forged_one_does_not(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    now = time.time()
    calls = {
        "forged": {WOKE_HEADER: "41000"},
        "lifted": {WOKE_HEADER: "41000",
                   WOKE_MARK_HEADER: sign_woke(OPERATOR, *HERE, "other-request", 41000, now)},
        "signed": {WOKE_HEADER: "13800",
                   WOKE_MARK_HEADER: sign_woke(OPERATOR, *HERE, "signed", 13800, now)},
    }
    async with aiohttp.ClientSession() as http:
        for request_id, headers in calls.items():
            async with http.post(rig.url + "/api/chat", json={**CHAT, "stream": False},
                                 headers={**headers, "X-Request-Id": request_id}) as resp:
                assert resp.status == 200
        entries = (await (await http.get(rig.admin_url + LEDGER_PATH)).json())["entries"]
    waits = {e["request_id"]: e["wake_wait_s"] for e in entries}
    assert waits == {"forged": None, "lifted": None, "signed": 13.8}
    logged = {json.loads(line)["request_id"]: json.loads(line).get("wake_wait_ms")
              for line in rig.log}
    assert logged == {"forged": None, "lifted": None, "signed": 13800.0}


async def test_a_renewal_keeps_the_gateway_closed_past_the_first_lease(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig, yield_lease=2.0)
    door = rig.gateway.gateway.door
    async with aiohttp.ClientSession() as http:
        assert (await _yield(http, rig, "yield", 0))[0] == 200
        first_until = door._closed_until
        assert first_until is not None
        assert (await _yield(http, rig, "yield", 0))[0] == 200
        assert door._closed_until is not None and door._closed_until > first_until
