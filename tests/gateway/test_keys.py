"""Who is asking, proven: the gateway's API keys (--keys-file, gateway/keys.py),
its admin port, and overflow spend bounded per caller (gateway/budget.py).

The gateway runs in front of the Ollama STAND-IN (tests/gateway/ollama_standin.py,
not Ollama) and, for overflow, the OpenAI-compatible STAND-IN
(tests/gateway/openai_standin.py); callers are the official `openai` and
`ollama` clients sending the key. The same keys in front of the real
llama-server: test_keys_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from localmodel.engines.ollama import TAGS_PATH
from localmodel.gateway.keys import BadKeys, KeysFile, digest_of, parse_keys
from localmodel.gateway.routes import ROUTES
from localmodel.gateway.server import start_gateway
from localmodel.gateway_contract import ADMIN_PATHS
from tests.gateway.harness import BASE, RawClient, Rig, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama
from tests.gateway.openai_standin import StandinOpenAI, start_openai_standin

FG_KEY = "lmk-foreground-4b1d7e0c9a2f"
BG_KEY = "lmk-background-77aa01ce5d93"
MODEL = "standin:1b"
HI = [{"role": "user", "content": "hi"}]


def keys_doc(*entries: dict[str, Any]) -> bytes:
    return json.dumps({"keys": list(entries)}).encode()


def entry(caller: str, key: str, **rights: Any) -> dict[str, Any]:
    return {"caller": caller, "sha256": digest_of(key), **rights}


def write_keys(path: Path, data: bytes) -> None:
    """As kubelet updates a mounted Secret: a new file swapped in atomically."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    write_keys(path, keys_doc(
        entry("chat-ui", FG_KEY, concurrency=1),
        entry("batch", BG_KEY, priority="background"),
    ))
    return path


async def keyed_rig(make_rig: RigFactory, keys_file: Path, **kw: Any) -> Rig:
    return await make_rig(StandinOllama(token_delay=0, tokens=3), keys_file=str(keys_file), **kw)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- 401 on every inference route of both APIs ---------------------------------------


async def test_every_inference_route_refuses_no_key_and_a_wrong_key(
    make_rig: RigFactory, keys_file: Path
) -> None:
    rig = await keyed_rig(make_rig, keys_file)
    wrong = [{}, bearer("lmk-not-a-key"), bearer(FG_KEY + "x"), {"Authorization": FG_KEY},
             {"Authorization": f"Basic {FG_KEY}"}, {"X-LocalModel-Caller": "chat-ui"}]
    async with aiohttp.ClientSession() as http:
        for route in ROUTES:
            for method in route.methods:
                for headers in wrong:
                    body = {"model": MODEL, "messages": HI, "prompt": "hi", "input": "hi"}
                    async with http.request(method, rig.url + route.path, headers=headers,
                                            json=body if method == "POST" else None) as resp:
                        assert resp.status == 401, (route.path, headers)
                        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                        doc = await resp.json()
                        message = doc["error"]["message"] if route.is_openai else doc["error"]
                        assert "API key" in message
    assert rig.standin.requests == []  # the engine saw none of them
    await wait_until(lambda: len(rig.log) == len(wrong) * len(ROUTES))
    assert {d["outcome"] for d in rig.log_docs()} == {"unauthorized"}
    assert {d["caller"] for d in rig.log_docs()} == {"anonymous"}  # a header claims nothing


async def test_official_clients_need_the_key(make_rig: RigFactory, keys_file: Path) -> None:
    rig = await keyed_rig(make_rig, keys_file)
    # openai: no valid key -> AuthenticationError (401) on chat, completions, models.
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key="wrong",
                                  max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await bad.completions.create(model=MODEL, prompt="hi")
        with pytest.raises(openai.AuthenticationError):
            await bad.embeddings.create(model=MODEL, input="hi")
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key=FG_KEY,
                                  max_retries=0) as good:
        reply = await good.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
        assert reply.choices[0].message.content
        assert [m.id async for m in good.models.list()]
    # ollama: the client sends whatever headers it is given.
    bad_ollama = ollama.AsyncClient(host=rig.url)
    for call in (bad_ollama.chat(model=MODEL, messages=HI), bad_ollama.generate(MODEL, "hi"),
                 bad_ollama.embed(MODEL, "hi"), bad_ollama.list(), bad_ollama.ps()):
        with pytest.raises(ollama.ResponseError) as refused:
            await call
        assert refused.value.status_code == 401
    good_ollama = ollama.AsyncClient(host=rig.url, headers=bearer(FG_KEY))
    answer = await good_ollama.chat(model=MODEL, messages=HI)
    assert answer.message.content
    assert (await good_ollama.generate(MODEL, "hi")).response
    assert [m.model for m in (await good_ollama.list()).models] == [MODEL]


# ---- the ledger's caller is the key's --------------------------------------------------


async def test_the_ledger_names_the_keys_caller_whatever_the_headers_claim(
    make_rig: RigFactory, keys_file: Path
) -> None:
    rig = await keyed_rig(make_rig, keys_file)
    claims = {"X-LocalModel-Caller": "admin", "X-LocalModel-Session": "s1"}
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key=FG_KEY, max_retries=0,
                                  default_headers=claims) as client:
        await client.chat.completions.create(model=MODEL, messages=HI, user="root")  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http, http.get(rig.admin_url + "/ledger") as resp:
        (record,) = (await resp.json())["entries"]
    assert (record["caller"], record["session"], record["outcome"]) == ("chat-ui", "s1", "ok")
    await wait_until(lambda: len(rig.log) == 1)
    assert rig.log_docs()[0]["caller"] == "chat-ui"


# ---- priorities and limits ----------------------------------------------------------


async def test_a_background_key_asking_foreground_is_demoted(
    make_rig: RigFactory, keys_file: Path
) -> None:
    """Demoted, not refused: every request of a background key is background.
    So it never queues: with the slot busy it gets 429 at once."""
    rig = await make_rig(StandinOllama(token_delay=0.02, tokens=400), keys_file=str(keys_file))
    fg = {"X-Priority": "foreground"}
    client = ollama.AsyncClient(host=rig.url, headers={**bearer(BG_KEY), **fg})
    await client.chat(model=MODEL, messages=HI, options={"num_predict": 2})
    holder = await RawClient.send(rig.port, "/api/generate", {"prompt": "long", "stream": True},
                                  headers=bearer(FG_KEY))
    await wait_until(lambda: rig.standin.active == 1)
    with pytest.raises(ollama.ResponseError) as busy:
        await client.chat(model=MODEL, messages=HI)
    assert busy.value.status_code == 429
    holder.close()
    await wait_until(lambda: len(rig.log) == 3)
    batch = [d for d in rig.log_docs() if d["caller"] == "batch"]
    assert [(d["priority"], d["outcome"]) for d in batch] == [
        ("background", "ok"), ("background", "rejected_busy")]


async def test_a_keys_concurrency_limit_refuses_the_request_past_it(
    make_rig: RigFactory, keys_file: Path
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.02, tokens=400), keys_file=str(keys_file),
                         slots=2)
    holder = await RawClient.send(rig.port, "/api/generate", {"prompt": "long", "stream": True},
                                  headers=bearer(FG_KEY))
    await wait_until(lambda: rig.standin.active == 1)
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key=FG_KEY,
                                  max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    assert "caller chat-ui has 1 request(s) in progress" in str(limited.value)
    # Another key is not held back by it (a free slot is left).
    other = ollama.AsyncClient(host=rig.url, headers=bearer(BG_KEY))
    assert (await other.generate(MODEL, "hi", options={"num_predict": 2})).response
    holder.close()
    await wait_until(lambda: rig.gateway.gateway.in_flight == 0)
    # Its place is given back when the request ends.
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key=FG_KEY,
                                  max_retries=0) as client:
        rig.standin.tokens = 2
        await client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]


# ---- reload -------------------------------------------------------------------------


async def test_a_changed_keys_file_is_loaded_and_a_broken_one_keeps_the_keys(
    make_rig: RigFactory, keys_file: Path
) -> None:
    rig = await keyed_rig(make_rig, keys_file)
    new_key = "lmk-rotated-0c4e9f1a22b8"

    async def status(key: str) -> int:
        async with aiohttp.ClientSession() as http, http.get(
            rig.url + TAGS_PATH, headers=bearer(key)
        ) as resp:
            return resp.status

    assert (await status(FG_KEY), await status(new_key)) == (200, 401)
    write_keys(keys_file, keys_doc(entry("chat-ui", new_key)))
    for _ in range(300):  # generous: checked every 2 s
        if await status(new_key) == 200:
            break
        await asyncio.sleep(0.1)
    assert (await status(FG_KEY), await status(new_key)) == (401, 200)
    write_keys(keys_file, b'{"keys": [{"caller": "x"}]}')
    keys = rig.gateway.gateway.keys
    assert keys is not None
    reloads = keys.reloads
    await asyncio.sleep(5)  # two checks at least
    assert keys.reloads == reloads and await status(new_key) == 200


def test_the_keys_file_is_checked_field_by_field() -> None:
    good = entry("a", "k")
    cases = {
        b"[]": 'expected {"keys": [...]}',
        b'{"keys": [1]}': "keys[0]: expected an object",
        keys_doc({**good, "caller": "no spaces"}): "keys[0].caller",
        keys_doc({**good, "sha256": "k"}): "keys[0].sha256: expected 64 lowercase hex",
        keys_doc({**good, "priority": "urgent"}): "keys[0].priority",
        keys_doc({**good, "overflow": "yes"}): "keys[0].overflow",
        keys_doc({**good, "concurrency": 0}): "keys[0].concurrency",
        keys_doc({**good, "overflowBudget": {"requests": 1}}): "keys[0].overflowBudget",
        keys_doc({**good, "overflowBudget": {"requests": 1, "seconds": float("inf")}}): "not JSON",
        keys_doc(good, entry("b", "k")): "keys[1].sha256: the same key twice",
        keys_doc({**good, "key": "k"}): "unknown field(s) key",
        b"[" * 100_000: "not JSON",
    }
    for data, reason in cases.items():
        with pytest.raises(BadKeys) as bad:
            parse_keys(data)
        assert reason in str(bad.value), (data[:60], str(bad.value))
    ring = parse_keys(keys_doc(good))
    assert ring.find("Bearer k") is ring.entries[0]
    assert ring.find("bearer  k ") is ring.entries[0]
    assert ring.find("Bearer K") is None and ring.find("Bearer " + "k" * 600) is None


async def test_a_gateway_with_an_unusable_keys_file_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"keys": "all"}')
    with pytest.raises(BadKeys):
        await start_gateway(replace(BASE, keys_file=str(path)))
    with pytest.raises(FileNotFoundError):
        KeysFile(str(tmp_path / "absent.json"), print)


# ---- keys off: as before ------------------------------------------------------------


async def test_without_keys_the_caller_header_still_names_the_caller(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2))
    client = ollama.AsyncClient(host=rig.url, headers={"X-LocalModel-Caller": "agent"})
    await client.chat(model=MODEL, messages=HI)
    await wait_until(lambda: len(rig.log) == 1)
    assert rig.log_docs()[0]["caller"] == "agent"


# ---- the admin port -------------------------------------------------------------------


async def test_metrics_speed_and_ledger_are_on_the_admin_port_only(
    make_rig: RigFactory, keys_file: Path
) -> None:
    rig = await keyed_rig(make_rig, keys_file)
    assert rig.gateway.admin_port not in (0, rig.port)
    async with aiohttp.ClientSession() as http:
        for path in ADMIN_PATHS:
            for headers in ({}, bearer(FG_KEY)):
                async with http.get(rig.url + path, headers=headers) as resp:
                    assert resp.status == 404, path
            async with http.get(rig.admin_url + path) as resp:
                assert resp.status == 200, path
        async with http.get(rig.admin_url + TAGS_PATH) as resp:
            assert resp.status == 404  # and the admin port serves no inference


# ---- overflow spend bounded per caller ----------------------------------------------


OVERFLOW_KEY = "sk-far-5d0e"


async def overflowing_rig(make_rig: RigFactory, keys: Path | None, **kw: Any) -> tuple[
    Rig, StandinOpenAI, Any
]:
    far = StandinOpenAI(api_key=OVERFLOW_KEY, tokens=2, token_delay=0)
    runner, url = await start_openai_standin(far)
    rig = await make_rig(
        StandinOllama(token_delay=0.02, tokens=2000), overflow_url=url,
        overflow_model="big", overflow_after=0.0, overflow_api_key=OVERFLOW_KEY,
        max_queue=0, **({} if keys is None else {"keys_file": str(keys)}), **kw,
    )
    return rig, far, runner


async def test_each_keys_overflow_budget_is_its_own_and_spent_is_a_clear_error(
    make_rig: RigFactory, tmp_path: Path
) -> None:
    """No local queue (--max-queue 0): while the slot is held, the overflow is
    the only way; a caller past its budget is told so, another is not held
    back, and a key without overflow rights never overflows."""
    keys = tmp_path / "keys.json"
    write_keys(keys, keys_doc(
        entry("chat-ui", FG_KEY, overflowBudget={"requests": 2, "seconds": 3600}),
        entry("team-b", BG_KEY.replace("background", "teamb")),
        entry("local-only", "lmk-local-only-aa", overflow=False),
        entry("holder", "lmk-holder-bb"),
    ))
    rig, far, runner = await overflowing_rig(make_rig, keys, overflow_budget=(1, 3600.0))
    try:
        holder = await RawClient.send(rig.port, "/api/generate", {"prompt": "long",
                                      "stream": True}, headers=bearer("lmk-holder-bb"))
        await wait_until(lambda: rig.standin.active == 1)

        async def ask(key: str) -> tuple[int, str]:
            async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key=key,
                                          max_retries=0) as client:
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model=MODEL, messages=HI)  # type: ignore[arg-type]
                except openai.APIStatusError as exc:
                    return exc.status_code, exc.message
                return raw.status_code, raw.headers["X-LocalModel-Served-By"]

        assert await ask(FG_KEY) == (200, "overflow")
        assert await ask(FG_KEY) == (200, "overflow")
        status, message = await ask(FG_KEY)
        assert status == 503 and "caller chat-ui's overflow budget (2 per 3600s) is spent" \
            in message
        team_b = BG_KEY.replace("background", "teamb")
        assert await ask(team_b) == (200, "overflow")  # the default: 1 per window, its own
        status, message = await ask(team_b)
        assert status == 503 and "caller team-b's overflow budget (1 per 3600s)" in message
        status, message = await ask("lmk-local-only-aa")
        assert status == 503 and "key does not allow overflow" in message
        assert len(far.calls) == 3
        holder.close()
    finally:
        await runner.cleanup()
    skipped = rig.gateway.gateway.metrics.overflow_skipped
    assert (skipped.value(("budget",)), skipped.value(("not_allowed",))) == (2, 1)


async def test_callers_without_a_key_share_the_default_budget(make_rig: RigFactory) -> None:
    """Keys off: a caller's name is only claimed, so a new name buys nothing."""
    rig, far, runner = await overflowing_rig(make_rig, None, overflow_budget=(1, 3600.0))
    try:
        holder = await RawClient.send(rig.port, "/api/generate", {"prompt": "long",
                                      "stream": True})
        await wait_until(lambda: rig.standin.active == 1)
        statuses = []
        for name in ("a", "b"):
            client = ollama.AsyncClient(host=rig.url, headers={"X-LocalModel-Caller": name})
            try:
                await client.chat(model=MODEL, messages=HI)
                statuses.append(200)
            except ollama.ResponseError as exc:
                statuses.append(exc.status_code)
                assert "the keyless callers' overflow budget (1 per 3600s) is spent" in str(exc)
        assert statuses == [200, 503] and len(far.calls) == 1
        holder.close()
    finally:
        await runner.cleanup()
