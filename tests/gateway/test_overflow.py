"""The overflow endpoint, with the gateway in front of the Ollama STAND-IN and
an OpenAI-compatible STAND-IN as the overflow (tests/gateway/openai_standin.py:
a real HTTP server on loopback that requires its API key and can be made to
fail or hang). Callers use the official `openai` and `ollama` clients. The
same behaviour against two real llama-servers is in test_overflow_engine.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from tests.gateway.harness import RawClient, Rig, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama
from tests.gateway.openai_standin import StandinOpenAI, start_openai_standin
from tests.harness.processes import free_port

KEY = "sk-test-overflow-7f3a9c"
AFTER = 0.3


@dataclass
class Setup:
    rig: Rig
    far: StandinOpenAI
    far_url: str

    @property
    def gateway(self) -> Any:
        return self.rig.gateway.gateway

    def metric(self, name: str, labels: tuple[str, ...] = ()) -> float:
        value: float = getattr(self.gateway.metrics, name).value(labels)
        return value


SetupFactory = Callable[..., Awaitable[Setup]]


@pytest.fixture
async def overflow_rig(make_rig: RigFactory) -> AsyncIterator[SetupFactory]:
    runners = []

    async def make(far: StandinOpenAI | None = None, **overrides: Any) -> Setup:
        far = far or StandinOpenAI(api_key=KEY)
        runner, url = await start_openai_standin(far)
        runners.append(runner)
        config: dict[str, Any] = {
            "overflow_url": url,
            "overflow_model": "big-model",
            "overflow_after": AFTER,
            "overflow_api_key": KEY,
        }
        config.update(overrides)
        rig = await make_rig(StandinOllama(token_delay=0.01, tokens=500), **config)
        return Setup(rig, far, url)

    yield make
    for runner in runners:
        await runner.cleanup()


async def hold_the_slot(setup: Setup, then: int | None = None) -> RawClient:
    """A long local generation holding the only slot (later ones: `then` tokens)."""
    holder = await RawClient.send(
        setup.rig.port, "/api/generate", {"prompt": "long", "stream": True}
    )
    await wait_until(lambda: setup.rig.standin.active == 1)
    if then is not None:
        setup.rig.standin.tokens = then
    return holder


def openai_client(setup: Setup, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=setup.rig.url + "/v1", api_key="caller-key", **kw)


async def test_held_slot_sends_a_foreground_request_to_the_overflow_after_the_wait(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig()
    holder = await hold_the_slot(setup)
    async with openai_client(setup) as client:
        start = time.monotonic()
        raw = await client.chat.completions.with_raw_response.create(
            model="standin:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
        took = time.monotonic() - start
    reply = raw.parse()
    assert raw.headers["X-LocalModel-Served-By"] == "overflow"
    assert reply.choices[0].message.content == "far0 far1 far2 far3 far4 "
    own = 5 * setup.far.token_delay
    print(f"overflowed after {took:.3f}s (after={AFTER}s, overflow's own time {own:.2f}s)")
    assert AFTER <= took < AFTER + own + 1.0  # generous: a loaded CI machine
    (call,) = setup.far.calls
    assert call.body["model"] == "big-model"  # the model name is replaced
    assert call.headers["Authorization"] == f"Bearer {KEY}"  # the key is sent
    assert not call.body.get("stream")  # as the caller asked
    assert call.body["messages"] == [{"role": "user", "content": "hi"}]
    assert setup.rig.standin.active == 1  # the local engine never saw it
    await wait_until(lambda: len(setup.rig.log) == 1)
    doc = setup.rig.log_docs()[0]
    assert (doc["served_by"], doc["outcome"], doc["status"]) == ("overflow", "ok", 200)
    assert setup.metric("overflow_requests", ("/v1/chat/completions", "ok")) == 1
    assert setup.gateway.metrics.overflow_duration.series[("/v1/chat/completions",)].count == 1
    holder.close()


async def test_streaming_overflow_is_relayed_as_sse(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup)
    async with openai_client(setup) as client:
        stream = await client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p for p in pieces if p) == "far0 far1 far2 far3 far4 "
    assert setup.far.calls[0].body["stream"] is True
    holder.close()


async def test_background_request_never_overflows(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup)
    async with openai_client(setup, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as err:
            await client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Priority": "background"},
            )
    assert err.value.response.headers["X-LocalModel-Served-By"] == "local"
    assert setup.far.calls == []
    holder.close()


async def test_free_slot_serves_locally(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(overflow_after=0)
    setup.rig.standin.tokens = 3
    async with openai_client(setup) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "hi"}]
        )
    assert raw.headers["X-LocalModel-Served-By"] == "local"
    assert raw.parse().choices[0].message.content == "tok0 tok1 tok2 "
    assert setup.far.calls == []
    assert setup.rig.log_docs()[0]["served_by"] == "local"


async def test_ollama_chat_callers_get_ollamas_shape_from_the_overflow(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup)
    client = ollama.AsyncClient(host=setup.rig.url)
    whole = await client.chat(
        model="standin:1b",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        options={"temperature": 0.1, "num_predict": 40, "num_ctx": 512},
    )
    assert whole.message.role == "assistant"
    assert whole.message.content == "far0 far1 far2 far3 far4 "
    assert whole.done and whole.done_reason == "stop"
    assert (whole.prompt_eval_count, whole.eval_count) == (7, 5)
    sent = setup.far.calls[0].body
    assert sent == {
        "model": "big-model",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "temperature": 0.1,
        "max_tokens": 40,
        "stream": False,
    }
    parts = [part async for part in await client.chat(model="x", messages=[], stream=True)]
    assert "".join(p.message.content or "" for p in parts) == "far0 far1 far2 far3 far4 "
    assert [p.done for p in parts] == [False] * 5 + [True]
    assert parts[-1].eval_count == 5
    assert setup.far.calls[1].body["stream_options"] == {"include_usage": True}
    holder.close()


async def test_ollama_generate_callers_get_ollamas_shape_from_the_overflow(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup)
    client = ollama.AsyncClient(host=setup.rig.url)
    whole = await client.generate(model="x", prompt="hello", system="sys", format="json")
    assert whole.response == "far0 far1 far2 far3 far4 " and whole.done
    assert setup.far.calls[0].body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello"},
    ]
    assert setup.far.calls[0].body["response_format"] == {"type": "json_object"}
    parts = [p async for p in await client.generate(model="x", prompt="hi", stream=True)]
    assert "".join(p.response or "" for p in parts) == "far0 far1 far2 far3 far4 "
    assert parts[-1].done
    holder.close()


async def test_untranslatable_ollama_request_waits_locally(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup, then=2)
    client = await RawClient.send(
        setup.rig.port, "/api/generate", {"prompt": "x", "raw": True, "stream": False}
    )
    await asyncio.sleep(0.2)
    assert setup.far.calls == []
    holder.close()
    status, headers, _ = await client.response()
    assert (status, headers["x-localmodel-served-by"]) == (200, "local")
    assert setup.metric("overflow_skipped", ("untranslatable",)) == 1


async def test_embeddings_never_overflow(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(overflow_after=0)
    holder = await hold_the_slot(setup)
    client = await RawClient.send(setup.rig.port, "/api/embed", {"input": "x"})
    await asyncio.sleep(0.2)
    holder.close()
    status, headers, _ = await client.response()
    assert (status, headers["x-localmodel-served-by"]) == (200, "local")
    assert setup.far.calls == []
    assert setup.metric("overflow_skipped", ("route",)) == 1


async def test_full_queue_overflows_instead_of_503(overflow_rig: SetupFactory) -> None:
    setup = await overflow_rig(max_queue=0, overflow_after=5)
    holder = await hold_the_slot(setup)
    async with openai_client(setup) as client:
        start = time.monotonic()
        raw = await client.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "hi"}]
        )
    assert raw.headers["X-LocalModel-Served-By"] == "overflow"
    assert time.monotonic() - start < 1  # no local wait is possible: at once
    holder.close()


# ---- failures --------------------------------------------------------------


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


async def test_overflow_down_falls_back_to_the_local_queue_and_is_counted_once(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig(overflow_url=closed_port_url(), overflow_after=0.05)
    holder = await hold_the_slot(setup, then=2)
    waiting = [await RawClient.send(setup.rig.port, "/v1/chat/completions", {"messages": []})]
    await wait_until(lambda: setup.metric("overflow_errors", ("connect",)) == 1)
    for _ in range(2):
        waiting.append(
            await RawClient.send(setup.rig.port, "/v1/chat/completions", {"messages": []})
        )
    await asyncio.sleep(0.2)
    gw = setup.gateway
    assert gw.board.snapshot().queued == 3  # they kept their places
    holder.close()
    for client in waiting:
        status, headers, _ = await client.response()
        assert (status, headers["x-localmodel-served-by"]) == (200, "local")
    await wait_until(lambda: len(setup.rig.log) == 4)
    # One attempt, then the breaker kept the others away: no retry storm.
    assert setup.metric("overflow_errors", ("connect",)) == 1
    assert setup.metric("overflow_skipped", ("cooling_down",)) == 2
    docs = setup.rig.log_docs()
    assert sorted(d.get("overflow_error", "") for d in docs) == ["", "", "", "connect"]


async def test_overflow_refusing_the_key_falls_back_and_the_key_stays_secret(
    overflow_rig: SetupFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    setup = await overflow_rig(StandinOpenAI(api_key="the-right-one"), overflow_after=0, deadline=5)
    holder = await hold_the_slot(setup, then=2)
    client = await RawClient.send(setup.rig.port, "/v1/chat/completions", {"messages": []})
    await wait_until(lambda: bool(setup.far.calls) and setup.far.calls[0].how == "refused")
    holder.close()
    status, headers, _ = await client.response()
    assert (status, headers["x-localmodel-served-by"]) == (200, "local")
    assert setup.far.calls[0].headers["Authorization"] == f"Bearer {KEY}"
    await wait_until(lambda: len(setup.rig.log) == 2)
    assert setup.metric("overflow_errors", ("status",)) == 1
    doc = setup.rig.log_docs()[-1]
    assert (doc["overflow_error"], doc["overflow_status"]) == ("status", 401)
    async with aiohttp.ClientSession() as session:
        outputs = []
        for url in (setup.rig.admin_url + "/metrics", *(
            setup.rig.url + path for path in ("/slots", "/healthz", "/readyz")
        )):
            async with session.get(url) as resp:
                outputs.append(await resp.text())
    outputs += setup.rig.log
    outputs.append(repr(setup.gateway.config))
    captured = capfd.readouterr()
    outputs += [captured.out, captured.err]
    assert all(KEY not in text for text in outputs)


async def test_hanging_overflow_does_not_hold_the_caller_past_its_deadline(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig(StandinOpenAI(api_key=KEY, hang=True), overflow_after=0)
    holder = await hold_the_slot(setup)
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(
            setup.rig.url + "/v1/chat/completions",
            json={"messages": []},
            headers={"X-Request-Timeout": "0.5"},
        ) as resp:
            took = time.monotonic() - start
            assert resp.status == 504
    assert 0.5 <= took < 1.5  # the deadline, not a hang (generous under load)
    call = setup.far.calls[0]
    await wait_until(lambda: call.ended is not None, timeout=2)
    assert call.how == "client_gone"  # the overflow connection was closed
    assert call.ended is not None and call.ended - (start + 0.5) < 0.5
    assert setup.metric("overflow_errors", ("timeout",)) == 1
    holder.close()


async def test_hanging_overflow_loses_the_race_to_a_freed_local_slot(
    overflow_rig: SetupFactory,
) -> None:
    setup = await overflow_rig(StandinOpenAI(api_key=KEY, hang=True), overflow_after=0)
    holder = await hold_the_slot(setup, then=2)
    client = await RawClient.send(setup.rig.port, "/api/chat", {"messages": [], "stream": False})
    await wait_until(lambda: bool(setup.far.calls))
    holder.close()
    status, headers, body = await client.response()
    assert (status, headers["x-localmodel-served-by"]) == (200, "local")
    assert json.loads(body)["message"]["content"] == "tok0 tok1 "
    call = setup.far.calls[0]
    await wait_until(lambda: call.ended is not None, timeout=2)
    assert call.how == "client_gone"


async def test_caller_leaving_an_overflowed_stream_closes_the_overflow_connection(
    overflow_rig: SetupFactory,
) -> None:
    far = StandinOpenAI(api_key=KEY, tokens=400, token_delay=0.01)
    setup = await overflow_rig(far, overflow_after=0)
    holder = await hold_the_slot(setup)
    client = await RawClient.send(setup.rig.port, "/api/chat", {"messages": [], "stream": True})
    await client.reader.readline()
    await wait_until(lambda: bool(far.calls))
    await asyncio.sleep(0.1)
    left = time.monotonic()
    client.close()
    call = far.calls[0]
    await wait_until(lambda: call.ended is not None, timeout=2)
    assert call.how == "client_gone" and call.ended is not None
    assert call.ended - left < 0.5
    await wait_until(lambda: len(setup.rig.log) == 1)
    assert setup.rig.log_docs()[0]["cancel_reason"] == "disconnect"
    holder.close()


async def test_deadline_during_an_overflowed_stream_ends_it_and_closes_the_overflow(
    overflow_rig: SetupFactory,
) -> None:
    far = StandinOpenAI(api_key=KEY, tokens=400, token_delay=0.01)
    setup = await overflow_rig(far, overflow_after=0)
    holder = await hold_the_slot(setup)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            setup.rig.url + "/api/chat",
            json={"messages": [], "stream": True},
            headers={"X-Request-Timeout": "0.4"},
        ) as resp,
    ):
        lines = (await resp.read()).splitlines()
    assert resp.headers["X-LocalModel-Served-By"] == "overflow"
    assert "deadline" in json.loads(lines[-1])["error"]
    call = far.calls[0]
    await wait_until(lambda: call.ended is not None, timeout=2)
    assert call.how == "client_gone"
    holder.close()


async def test_a_key_the_overflow_echoes_across_two_reads_never_reaches_a_caller(
    overflow_rig: SetupFactory,
) -> None:
    """A careless endpoint says the key back, each time cut between two writes
    (and once a token at a time): neither the relayed stream (OpenAI callers)
    nor the translated one (Ollama callers), streamed or whole, carries it."""
    said = [f"echo {KEY} ", "then ", KEY[:7], KEY[7:], " end"]
    clean = "echo [redacted] then [redacted] end"
    far = StandinOpenAI(api_key=KEY, say=said, split_on=KEY)
    setup = await overflow_rig(far, overflow_after=0)
    holder = await hold_the_slot(setup)
    ask = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    raw: list[bytes] = []
    async with aiohttp.ClientSession() as session:
        for path, stream in [("/api/chat", True), ("/api/chat", False),
                             ("/v1/chat/completions", True), ("/v1/chat/completions", False)]:
            async with session.post(setup.rig.url + path, json={**ask, "stream": stream}) as r:
                assert r.status == 200
                assert r.headers["X-LocalModel-Served-By"] == "overflow"
                raw.append(await r.read())
    assert len(far.calls) == 4
    for body in raw:
        assert KEY.encode() not in body
    ollama_told = [json.loads(line)["message"]["content"] for line in raw[0].splitlines()]
    assert "".join(ollama_told) == clean
    assert json.loads(raw[1])["message"]["content"] == clean
    # Relayed as the endpoint sent it: the key whole within one event is
    # scrubbed across the reads; cut between two events, each half is the
    # caller's to join (docs/security.md says so).
    assert raw[2].count(b"[redacted]") == 1
    assert json.loads(raw[3])["choices"][0]["message"]["content"] == clean
    holder.close()
