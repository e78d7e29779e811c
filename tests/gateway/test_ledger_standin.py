"""The ledger's glue in the gateway, in front of the Ollama stand-in (not
Ollama; the real engines are test_ledger_engine.py and
test_gateway_ollama.py): who is asking, GET /ledger and its filters, the log
line, the per-caller metrics, and a hostile caller."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from localmodel.doctor.metrics import parse_metrics
from localmodel.gateway.ledger import MAX_CALLER_LABELS, MAX_NAME, MAX_SESSIONS, OTHER
from tests.gateway.harness import RawClient, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str
) -> int:
    async with session.post(url, json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _ledger(session: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with session.get(url + "/ledger", params=params) as resp:
        return resp.status, await resp.json()


async def test_ledger_names_callers_and_sessions_and_filters(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2))
    chat = rig.url + "/api/chat"
    msgs = [{"role": "user", "content": "hi"}]
    async with aiohttp.ClientSession() as http:
        h = {"X-LocalModel-Caller": "agent", "X-LocalModel-Session": "s1"}
        assert await _post(http, chat, {"messages": msgs, "stream": False}, **h) == 200
        longer = [*msgs, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
        assert await _post(http, chat, {"messages": longer, "stream": False}, **h) == 200
        compacted = [{"role": "user", "content": "summary"}]
        assert await _post(http, chat, {"messages": compacted, "stream": False}, **h) == 200
        # The OpenAI `user` field names a caller that sent no header.
        openai = rig.url + "/v1/chat/completions"
        assert await _post(http, openai, {"messages": msgs, "user": "bob"}) == 200
        bg = {"X-Priority": "background"}
        assert await _post(http, rig.url + "/api/generate", {"prompt": "x"}, **bg) == 200

        status, doc = await _ledger(http, rig.admin_url)
        assert status == 200 and doc["recorded"] == 5 and doc["dropped"] == 0
        entries = doc["entries"]
        assert [(e["caller"], e["session"]) for e in entries] == [
            ("agent", "s1"), ("agent", "s1"), ("agent", "s1"), ("bob", None), ("anonymous", None)
        ]
        assert [e["rewrite"] for e in entries] == [False, False, True, None, None]
        first = entries[0]
        assert first["outcome"] == "ok" and first["served_by"] == "local"
        assert first["prompt_tokens"] is not None and first["cached_tokens"] == 0
        assert first["slot_s"] is not None and first["queue_wait_s"] == 0.0

        _, picked = await _ledger(http, rig.admin_url, caller="agent")
        assert len(picked["entries"]) == 3
        _, picked = await _ledger(http, rig.admin_url, priority="background")
        assert [e["caller"] for e in picked["entries"]] == ["anonymous"]
        _, picked = await _ledger(http, rig.admin_url, since="1h")
        assert len(picked["entries"]) == 5
        _, picked = await _ledger(http, rig.admin_url, since="2999-01-01T00:00:00Z")
        assert picked["entries"] == []
        status, bad = await _ledger(http, rig.admin_url, since="soon")
        assert status == 400 and "since" in bad["error"]

        async with http.get(rig.admin_url + "/metrics") as resp:
            samples = parse_metrics(await resp.text())
    rewrites = samples[
        ("localmodel_gateway_prompt_rewrites_total", frozenset({("caller", "agent")}))
    ]
    assert rewrites == 1
    cached = ("localmodel_gateway_prompt_tokens_cached_total", frozenset({("caller", "agent")}))
    assert samples[cached] == 0
    # The log line carries the same facts.
    logged = rig.log_docs()
    assert [d["caller"] for d in logged[:3]] == ["agent"] * 3
    assert logged[2]["rewrite"] is True and logged[3]["caller"] == "bob"


async def test_waited_behind_names_the_holder(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=40))
    holder = await RawClient.send(
        rig.port, "/api/generate", {"prompt": "hold", "stream": False},
        {"X-LocalModel-Caller": "indexer"},
    )
    await wait_until(lambda: rig.standin.active == 1)
    waiter = await RawClient.send(
        rig.port, "/api/generate", {"prompt": "q", "stream": False},
        {"X-LocalModel-Caller": "alice"},
    )
    assert (await holder.response())[0] == 200
    assert (await waiter.response())[0] == 200
    async with aiohttp.ClientSession() as http:
        _, doc = await _ledger(http, rig.admin_url, caller="alice")
    [alice] = doc["entries"]
    [behind] = alice["waited_behind"]
    assert (behind["caller"], behind["priority"]) == ("indexer", "foreground")
    # All of its wait was spent behind the one holder.
    assert abs(behind["seconds"] - alice["queue_wait_s"]) < 0.002
    assert alice["queue_wait_s"] > 0.1
    assert "caller indexer (foreground)" in rig.log_docs()[-1]["waited_behind"]


async def test_a_caller_that_leaves_is_recorded_as_abandoned_at_once(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=500))
    client = await RawClient.send(
        rig.port, "/api/generate", {"prompt": "x", "stream": False},
        {"X-LocalModel-Caller": "indexer", "X-Priority": "background"},
    )
    await wait_until(lambda: rig.standin.active == 1)
    await asyncio.sleep(0.2)
    client.close()
    await wait_until(lambda: len(rig.log) == 1)
    async with aiohttp.ClientSession() as http:
        _, doc = await _ledger(http, rig.admin_url)
    [entry] = doc["entries"]
    assert entry["outcome"] == "cancelled_disconnect"
    assert entry["caller_gone_s"] >= 0.2 and entry["slot_s"] >= 0.2
    assert entry["abandoned_s"] < 0.05


async def test_ledger_off_serves_404_and_the_requests_still_go(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=1), ledger_size=0)
    async with aiohttp.ClientSession() as http:
        assert await _post(http, rig.url + "/api/generate", {"prompt": "x"}) == 200
        status, doc = await _ledger(http, rig.admin_url)
    assert status == 404 and "--ledger-size 0" in doc["error"]
    assert rig.gateway.gateway.pipeline.sessions is None


async def test_hostile_callers_are_bounded_and_still_served(make_rig: RigFactory) -> None:
    """10,000 distinct caller and session names, oversized and binary header
    values: the ring, the sessions and the metric labels stay bounded, every
    request is served, nothing crashes."""
    size = 500
    standin = StandinOllama(token_delay=0, tokens=1, keep_records=False)
    rig = await make_rig(standin, ledger_size=size, slots=8, max_queue=64)
    gateway = rig.gateway.gateway
    n = 10_000
    sem = asyncio.Semaphore(16)
    statuses: dict[int, int] = {}
    start = time.monotonic()

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        headers = {"X-LocalModel-Caller": f"caller-{i}", "X-LocalModel-Session": f"s-{i}"}
        body = {"messages": [{"role": "user", "content": str(i)}], "stream": False}
        async with sem, http.post(rig.url + "/api/chat", json=body, headers=headers) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one(http, i) for i in range(n)))
    elapsed = time.monotonic() - start
    assert statuses == {200: n}, statuses
    assert len(gateway.ledger or []) == size
    assert gateway.ledger is not None and gateway.ledger.recorded == n
    sessions = gateway.pipeline.sessions
    assert sessions is not None and len(sessions) == MAX_SESSIONS
    async with aiohttp.ClientSession() as http, http.get(rig.admin_url + "/metrics") as resp:
        samples = parse_metrics(await resp.text())
    callers = {
        dict(labels)["caller"]
        for name, labels in samples
        if name == "localmodel_gateway_prompt_tokens_cached_total"
    }
    assert len(callers) == MAX_CALLER_LABELS + 1 and OTHER in callers
    print(f"{n} requests with distinct callers and sessions in {elapsed:.1f} s")

    # Oversized, binary and control-character values, on a bare socket.
    hostile = [
        b"x" * 8000,
        b"\xff\xfe\xfd binary \x80\x81",
        "ünïcödé ✓".encode(),
        b"a\tb",
    ]
    for raw in hostile:
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
        body = json.dumps({"prompt": "x", "stream": False}).encode()
        writer.write(
            b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"X-LocalModel-Caller: " + raw + b"\r\nX-LocalModel-Session: " + raw + b"\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        await writer.drain()
        line = await reader.readline()
        writer.close()
        assert line.split()[1] == b"200", (raw[:40], line)
    async with aiohttp.ClientSession() as http:
        _, doc = await _ledger(http, rig.admin_url)
    for entry in doc["entries"][-len(hostile):]:
        assert len(entry["caller"]) <= MAX_NAME and entry["caller"].isascii()
        assert entry["caller"].isprintable() and " " not in entry["caller"]
    assert gateway.unexpected_errors == 0
