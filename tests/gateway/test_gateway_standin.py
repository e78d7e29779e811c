"""The gateway in front of the Ollama STAND-IN (not Ollama: a test server that
speaks Ollama's NDJSON with its timing fields and, like the field report, keeps
generating a non-streaming request after its client leaves). The same routes
against the real Ollama are in test_gateway_ollama.py."""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from typing import Any

import aiohttp
import pytest

from localmodel.engines import ollama
from localmodel.gateway.server import start_gateway
from localmodel.gateway_contract import GatewayConfig
from tests.gateway.harness import RawClient, RigFactory, books_reach, wait_until
from tests.gateway.ollama_standin import StandinOllama, start_standin

LONG = StandinOllama(token_delay=0.01, tokens=300)  # about 3 s of generation


def long_standin() -> StandinOllama:
    return StandinOllama(token_delay=LONG.token_delay, tokens=LONG.tokens)


# ---- the field failure, and the fix ------------------------------------------


async def test_standin_reproduces_the_field_failure_without_the_gateway() -> None:
    """Control: straight to the stand-in, a non-streaming caller that leaves
    does not stop generation. This is what the gateway must prevent."""
    standin = StandinOllama(token_delay=0.005, tokens=60)
    runner, url = await start_standin(standin)
    try:
        port = int(url.rsplit(":", 1)[1])
        client = await RawClient.send(port, "/api/generate", {"prompt": "x", "stream": False})
        await wait_until(lambda: bool(standin.generations) and standin.generations[0].tokens >= 3)
        client.close()
        gen = standin.generations[0]
        await wait_until(lambda: gen.stopped is not None, timeout=5)
        assert gen.stop_reason == "done"
        assert gen.tokens == 60  # it ran to the end for nobody
    finally:
        await runner.cleanup()


async def test_non_streaming_caller_disconnect_stops_upstream_generation(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(long_standin())
    client = await RawClient.send(rig.port, "/api/generate", {"prompt": "x", "stream": False})
    await wait_until(
        lambda: bool(rig.standin.generations) and rig.standin.generations[0].tokens >= 3
    )
    gen = rig.standin.generations[0]
    assert gen.streamed  # the gateway asked for a stream although the caller did not
    left = time.monotonic()
    client.close()
    stopped = await wait_until(lambda: gen.stopped is not None, timeout=2)
    assert gen.stop_reason == "client_gone"
    took = 1000 * (stopped - left)
    print(f"stand-in non-streaming disconnect: upstream stopped {took:.1f} ms after")
    assert took < 100, f"upstream stopped {took:.1f} ms after"
    assert gen.tokens < LONG.tokens
    await wait_until(lambda: len(rig.log) == 1)
    doc = rig.log_docs()[0]
    assert (doc["outcome"], doc["cancel_reason"]) == ("cancelled_disconnect", "disconnect")
    assert rig.gateway.gateway.board.snapshot().busy == 0
    metrics = rig.gateway.gateway.metrics
    assert metrics.cancellations.value(("disconnect",)) == 1


async def test_streaming_caller_disconnect_stops_upstream_generation(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin())
    client = await RawClient.send(rig.port, "/api/chat", {"messages": [], "stream": True})
    await client.reader.readline()  # status line: the stream has started
    await wait_until(
        lambda: bool(rig.standin.generations) and rig.standin.generations[0].tokens >= 3
    )
    left = time.monotonic()
    client.close()
    gen = rig.standin.generations[0]
    stopped = await wait_until(lambda: gen.stopped is not None, timeout=2)
    assert gen.stop_reason == "client_gone"
    assert stopped - left < 0.1


async def test_deadline_header_cancels_upstream_and_answers_504(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin())
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(
            rig.url + "/api/generate",
            json={"prompt": "x", "stream": False},
            headers={"X-Request-Timeout": "0.3"},
        ) as resp:
            answered = time.monotonic()
            body = await resp.json()
    assert resp.status == 504
    assert "deadline" in body["error"]
    assert 0.3 <= answered - start < 0.6
    gen = rig.standin.generations[0]
    stopped = await wait_until(lambda: gen.stopped is not None, timeout=2)
    assert gen.stop_reason == "client_gone"
    print(f"stand-in deadline: upstream stopped {1000 * (stopped - start - 0.3):.1f} ms after it")
    assert stopped - (start + 0.3) < 0.1
    doc = rig.log_docs()[0]
    assert (doc["outcome"], doc["cancel_reason"]) == ("cancelled_deadline", "deadline")


async def test_default_deadline_applies_and_header_cannot_exceed_it(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin(), deadline=0.2)
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(
            rig.url + "/api/chat",
            json={"messages": [], "stream": False},
            headers={"X-Request-Timeout": "100"},
        ) as resp:
            assert resp.status == 504
        assert time.monotonic() - start < 0.5


async def test_streaming_caller_past_deadline_gets_an_error_line_and_the_end(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(long_standin())
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            rig.url + "/api/generate", json={"prompt": "x"}, headers={"X-Request-Timeout": "0.2"}
        ) as resp,
    ):
        assert resp.status == 200
        lines = (await resp.read()).decode().strip().splitlines()
    assert json.loads(lines[0])["done"] is False
    assert "deadline" in json.loads(lines[-1])["error"]
    gen = rig.standin.generations[0]
    await wait_until(lambda: gen.stopped is not None, timeout=2)
    assert gen.stop_reason == "client_gone"


async def test_bad_timeout_header_is_400(make_rig: RigFactory) -> None:
    rig = await make_rig()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            rig.url + "/api/generate", json={"prompt": "x"}, headers={"X-Request-Timeout": "soon"}
        ) as resp,
    ):
        assert resp.status == 400
        assert "X-Request-Timeout" in (await resp.json())["error"]
    assert rig.standin.generations == []


# ---- responses have the engine's shape ---------------------------------------


async def test_non_streaming_generate_gets_ollamas_final_object(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=5))
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x", "stream": False}) as resp,
    ):
        doc = await resp.json()
    assert resp.status == 200
    assert doc["response"] == "tok0 tok1 tok2 tok3 tok4 "
    assert doc["done"] is True and doc["done_reason"] == "stop"
    for key in (
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
        "context",
        "model",
        "created_at",
    ):
        assert key in doc
    assert doc["eval_count"] == 5


async def test_non_streaming_chat_gets_the_whole_message(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=3))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            rig.url + "/api/chat",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": False},
        ) as resp,
    ):
        doc = await resp.json()
    assert doc["message"] == {"role": "assistant", "content": "tok0 tok1 tok2 "}
    assert doc["done_reason"] == "stop"


async def test_streaming_caller_gets_the_engines_bytes(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=3))
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp,
    ):
        assert resp.content_type == "application/x-ndjson"
        objs = [json.loads(line) for line in (await resp.read()).splitlines()]
    assert [o["done"] for o in objs] == [False, False, False, True]
    doc = rig.log_docs()[0]
    assert doc["generated_tokens"] == 3 and doc["stream"] is True


async def test_streaming_caller_sees_the_status_while_the_engine_is_in_prefill(
    make_rig: RigFactory,
) -> None:
    """The relay holds its headers back only to send them in one write with a
    chunk that has already arrived; while the engine is still in prefill the
    caller gets the status at once, and the bytes are the engine's."""
    rig = await make_rig(StandinOllama(prefill_delay=0.5, token_delay=0, tokens=2))
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp:
            headers_after = time.monotonic() - start
            assert resp.status == 200
            body = await resp.read()
        body_after = time.monotonic() - start
    assert headers_after < 0.3, f"status after {headers_after:.3f}s, during prefill"
    assert body_after >= 0.5
    assert [json.loads(line)["done"] for line in body.splitlines()] == [False, False, True]


async def test_openai_routes_on_ollama_assemble_completion_objects(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=4))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            rig.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        ) as resp:
            chat = await resp.json()
        async with session.post(rig.url + "/v1/completions", json={"prompt": "hi"}) as resp:
            text = await resp.json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 "
    assert chat["usage"]["completion_tokens"] == 4
    assert text["object"] == "text_completion"
    assert text["choices"][0]["text"] == "tok0 tok1 tok2 tok3 "
    # The model defaulted to --model.
    assert rig.standin.requests[0][1]["model"] == "standin:1b"


async def test_owned_settings_reach_the_engine(make_rig: RigFactory) -> None:
    rig = await make_rig(
        StandinOllama(token_delay=0, tokens=3),
        threads=3,
        context=2048,
        max_tokens=100,
        keep_alive="10m",
    )
    async with aiohttp.ClientSession() as session:
        body = {
            "prompt": "x",
            "stream": False,
            "options": {"num_thread": 64, "num_ctx": 100000, "num_predict": 5000},
        }
        async with session.post(rig.url + "/api/generate", json=body) as resp:
            assert resp.status == 200
        async with session.post(rig.url + "/api/embed", json={"input": ["a", "b"]}) as resp:
            assert resp.status == 200
            assert len((await resp.json())["embeddings"]) == 2
    sent = rig.standin.requests[0][1]
    assert sent["options"] == {"num_thread": 3, "num_ctx": 2048, "num_predict": 100}
    assert sent["keep_alive"] == "10m"
    assert sent["stream"] is True
    embed = rig.standin.requests[1][1]
    assert embed["options"] == {"num_thread": 3, "num_ctx": 2048}


async def test_a_callers_keep_alive_reaches_the_engine_as_the_pods(make_rig: RigFactory) -> None:
    """keep_alive 0 from any caller would unload the model after each request
    (the real Ollama shows it: test_gateway_ollama.py); the engine gets the
    pod's on the native routes and none on the OpenAI one (the stand-in
    records what arrived)."""
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2), keep_alive="10m")
    async with aiohttp.ClientSession() as session:
        for path, body in [
            ("/api/generate", {"prompt": "x", "stream": False, "keep_alive": 0}),
            ("/api/chat", {"messages": [], "stream": True, "keep_alive": "0s"}),
            ("/api/chat", {"messages": [], "stream": False, "keep_alive": "10m"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "keep_alive": 0}),
        ]:
            async with session.post(rig.url + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        async with session.get(rig.admin_url + "/metrics") as resp:
            metrics = await resp.text()
    sent = [body.get("keep_alive", "absent") for _, body in rig.standin.requests]
    assert sent == ["10m", "10m", "10m", "absent"]
    # The caller's own 10m was already the pod's: three rewritten.
    assert 'localmodel_gateway_options_rewritten_total{option="keep_alive"} 3' in metrics


async def test_options_that_would_reload_the_model_reach_the_engine_as_the_pods(
    make_rig: RigFactory,
) -> None:
    """Ollama reloads a loaded model for a request whose load options differ
    (server/sched.go, needsReload): a smaller num_ctx or another num_batch
    from one caller would cost every caller a reload."""
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2), threads=3, context=2048)
    callers = [
        {"num_ctx": 512},
        {"num_batch": 64, "num_gpu": 1, "use_mmap": False},
        {"num_ctx": 2048, "num_thread": 3, "temperature": 0.3},
    ]
    async with aiohttp.ClientSession() as session:
        for options in callers:
            body = {"messages": [], "stream": False, "options": options}
            async with session.post(rig.url + "/api/chat", json=body) as resp:
                assert resp.status == 200
        async with session.get(rig.admin_url + "/metrics") as resp:
            metrics = await resp.text()
    received = [body["options"] for _, body in rig.standin.requests]
    pod = {"num_thread": 3, "num_ctx": 2048, "num_predict": 4096}
    assert received == [pod, pod, pod | {"temperature": 0.3}]
    for option in ("num_ctx", "num_batch", "num_gpu", "use_mmap"):
        assert f'localmodel_gateway_options_rewritten_total{{option="{option}"}} 1' in metrics
    assert 'option="num_thread"' not in metrics  # already the pod's value


def test_relay_response_relies_on_a_private_aiohttp_attribute_that_still_exists() -> None:
    """RelayResponse sends headers with the first chunk by setting aiohttp's
    private `_send_headers_immediately` (web.Response sets it False). If
    aiohttp renames it, headers silently go out alone again: fail loudly."""
    from aiohttp import web

    from localmodel.gateway.wire import RelayResponse

    assert web.StreamResponse._send_headers_immediately is True
    assert web.Response._send_headers_immediately is False
    assert RelayResponse._send_headers_immediately is False


async def test_passthrough_routes(make_rig: RigFactory) -> None:
    rig = await make_rig()
    async with aiohttp.ClientSession() as session:
        for path in (ollama.TAGS_PATH, ollama.PS_PATH, ollama.VERSION_PATH, "/v1/models"):
            async with session.get(rig.url + path) as resp:
                assert resp.status == 200, path
                await resp.json()
        async with session.post(rig.url + ollama.SHOW_PATH, json={"model": "standin:1b"}) as resp:
            assert (await resp.json())["modelfile"] == "FROM standin:1b"
    assert rig.gateway.gateway.board.snapshot().busy == 0


# ---- priority, queue, /slots -------------------------------------------------


async def _occupy(rig_port: int, n: int, path: str = "/api/generate") -> list[RawClient]:
    return [
        await RawClient.send(rig_port, path, {"prompt": f"hold{i}", "stream": False})
        for i in range(n)
    ]


async def test_background_gets_429_at_once_and_never_reaches_the_engine(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(long_standin())
    holders = await _occupy(rig.port, 1)
    await wait_until(lambda: rig.standin.active == 1)
    before = len(rig.standin.requests)
    async with aiohttp.ClientSession() as session:
        latencies = []
        for _ in range(20):
            start = time.perf_counter()
            async with session.post(
                rig.url + "/api/generate",
                json={"prompt": "bg"},
                headers={"X-Priority": "background"},
            ) as resp:
                await resp.read()
            latencies.append(time.perf_counter() - start)
            assert resp.status == 429
            assert int(resp.headers["Retry-After"]) >= 1
    assert len(rig.standin.requests) == before
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.01, latencies  # median; p99 is the benchmark's
    for client in holders:
        client.close()


async def test_background_is_served_when_a_slot_is_free(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            rig.url + "/api/generate",
            json={"prompt": "x", "stream": False},
            headers={"X-Priority": "background"},
        ) as resp,
    ):
        assert resp.status == 200


async def test_request_id_is_echoed_and_logged(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=1))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            rig.url + "/api/chat", json={"messages": []}, headers={"X-Request-Id": "abc-1"}
        ) as resp:
            assert resp.headers["X-Request-Id"] == "abc-1"
        async with session.post(rig.url + "/api/chat", data=b"{") as resp:
            made_up = resp.headers["X-Request-Id"]
    assert [d["request_id"] for d in rig.log_docs()] == ["abc-1", made_up]


async def test_foreground_requests_are_served_in_arrival_order(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.005, tokens=10), max_queue=10)
    gateway = rig.gateway.gateway
    clients = []
    for i in range(6):
        clients.append(
            await RawClient.send(rig.port, "/api/generate", {"prompt": f"job{i}", "stream": False})
        )
        # Each one is in the books before the next is sent: arrival order is known.
        await wait_until(partial(books_reach, gateway.board, i + 1))
    # A background request cannot jump the queue.
    bg = await RawClient.send(
        rig.port, "/api/generate", {"prompt": "bg"}, {"X-Priority": "background"}
    )
    assert (await bg.response())[0] == 429
    for client in clients:
        status, _, _ = await client.response()
        assert status == 200
    order = [body["prompt"] for _, body in rig.standin.requests]
    assert order == [f"job{i}" for i in range(6)]
    assert rig.standin.max_active == 1


async def test_queue_full_is_503_with_retry_after(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin(), max_queue=2)
    holders = await _occupy(rig.port, 3)
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 2)
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp,
    ):
        assert resp.status == 503
        assert "Retry-After" in resp.headers
        assert "queue full" in (await resp.json())["error"]
    for client in holders:
        client.close()
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().busy == 0)


async def test_slots_is_exact_under_concurrency(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin(), slots=2, max_queue=10)
    async with aiohttp.ClientSession() as session:

        async def slots() -> dict[str, Any]:
            async with session.get(rig.url + "/slots") as resp:
                doc: dict[str, Any] = await resp.json()
                return doc

        doc = await slots()
        assert (doc["total"], doc["busy"], doc["queued"]) == (
            2,
            0,
            {"foreground": 0, "background": 0},
        )
        clients = await asyncio.gather(
            *[
                RawClient.send(
                    rig.port,
                    "/api/chat",
                    {"messages": [{"role": "user", "content": f"c{i}"}], "stream": False},
                )
                for i in range(7)
            ]
        )
        # Seven concurrent arrivals: exactly two hold slots, five wait.
        await wait_until(lambda: rig.standin.active == 2)
        await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 5)
        doc = await slots()
        assert doc["busy"] == 2 and doc["free"] == 0
        assert doc["queued"] == {"foreground": 5, "background": 0}
        assert (doc["model"], doc["threads"], doc["context"]) == ("standin:1b", 2, 4096)
        # Three callers give up: one holding a slot and two waiting.
        first = rig.standin.generations[0]

        def tag(gen_index: int) -> int:
            return int(rig.standin.generations[gen_index].body["messages"][0]["content"][1:])

        holding = {tag(0), tag(1)}
        waiting = [i for i in range(7) if i not in holding]
        for i in (tag(0), waiting[-1], waiting[-2]):
            clients[i].close()
        await wait_until(lambda: first.stopped is not None)
        await wait_until(lambda: len(rig.standin.generations) == 3)
        await wait_until(lambda: rig.standin.active == 2)
        await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 2)
        doc = await slots()
        assert doc["busy"] == 2 and doc["queued"]["foreground"] == 2
        assert rig.standin.active == doc["busy"]
        for client in clients:
            client.close()
        await wait_until(lambda: rig.gateway.gateway.board.snapshot().busy == 0)
        await wait_until(lambda: rig.standin.active == 0)
        doc = await slots()
        assert (doc["busy"], doc["queued"]["foreground"]) == (0, 0)


async def test_queued_caller_that_leaves_never_reaches_the_engine(make_rig: RigFactory) -> None:
    rig = await make_rig(long_standin(), max_queue=4)
    holder = (await _occupy(rig.port, 1))[0]
    await wait_until(lambda: rig.standin.active == 1)
    waiter = await RawClient.send(rig.port, "/api/generate", {"prompt": "waiter", "stream": False})
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 1)
    waiter.close()
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().queued == 0)
    holder.close()
    await wait_until(lambda: rig.gateway.gateway.board.snapshot().busy == 0)
    assert [b["prompt"] for _, b in rig.standin.requests] == ["hold0"]


# ---- hardening ---------------------------------------------------------------


async def test_malformed_json_is_400_naming_the_problem(make_rig: RigFactory) -> None:
    rig = await make_rig()
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/chat", data=b'{"messages": [}') as resp,
    ):
        assert resp.status == 400
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert "malformed JSON" in error and "line 1 column" in error
    assert rig.standin.requests == []


async def test_body_over_the_limit_is_413(make_rig: RigFactory) -> None:
    rig = await make_rig(max_body_bytes=1000)
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x" * 5000}) as resp,
    ):
        assert resp.status == 413
        assert "1000 bytes" in (await resp.json())["error"]
    assert rig.standin.requests == []


async def test_upstream_down_is_502_quickly() -> None:
    # A port nothing listens on.
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    config = GatewayConfig(
        listen_host="127.0.0.1", listen_port=0, upstream=f"http://127.0.0.1:{port}"
    )
    log: list[str] = []
    gw = await start_gateway(config, log.append)
    try:
        async with aiohttp.ClientSession() as session:
            start = time.monotonic()
            async with session.post(
                gw.url + "/api/generate", json={"prompt": "x", "stream": False}
            ) as resp:
                assert resp.status == 502
                assert "unreachable" in (await resp.json())["error"]
            assert time.monotonic() - start < 1.0
            async with session.get(gw.url + "/readyz") as resp:
                assert resp.status == 503
            async with session.get(gw.url + "/healthz") as resp:
                assert resp.status == 200
        assert gw.gateway.board.snapshot().busy == 0
        assert gw.gateway.metrics.upstream_errors.value(("connect",)) == 1
    finally:
        await gw.stop()


async def test_engine_closing_before_answering_is_retried_once(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2, drop_next=1))
    async with aiohttp.ClientSession() as session:
        async with session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp:
            assert resp.status == 200
        rig.standin.drop_next = 2
        async with session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp:
            assert resp.status == 502
    errors = rig.gateway.gateway.metrics.upstream_errors
    assert errors.value(("disconnect_retried",)) == 2
    assert errors.value(("connect",)) == 1


async def test_upstream_error_status_is_relayed(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(fail_status=404))
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x"}) as resp,
    ):
        assert resp.status == 404
        assert (await resp.json())["error"] == "stand-in failure"
    assert rig.log_docs()[0]["outcome"] == "upstream_status"


async def test_engine_error_mid_stream_for_non_streaming_caller(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=10, error_after=2))
    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url + "/api/generate", json={"prompt": "x", "stream": False}) as resp,
    ):
        assert resp.status == 500
        assert (await resp.json())["error"] == "stand-in engine failure"
    assert rig.log_docs()[0]["outcome"] == "upstream_error"
    assert rig.gateway.gateway.board.snapshot().busy == 0


async def test_idle_connection_and_slow_headers_are_closed(make_rig: RigFactory) -> None:
    rig = await make_rig(idle_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    writer.write(b"POST /api/generate HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    await writer.drain()
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), timeout=3) == b""  # closed by the server
    assert time.monotonic() - start < 2
    writer.close()


async def test_slow_body_is_408(make_rig: RigFactory) -> None:
    rig = await make_rig(body_timeout=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    writer.write(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), timeout=3)
    assert b" 408 " in status
    writer.close()


# ---- readiness, metrics, logs ------------------------------------------------


async def test_readyz_loads_the_model_with_owned_settings(make_rig: RigFactory) -> None:
    standin = StandinOllama(token_delay=0, tokens=1, loaded=False)
    rig = await make_rig(standin, threads=3, context=1024)
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 503
            assert "not loaded" in (await resp.json())["reason"]
        await wait_until(lambda: bool(standin.requests))
        path, body = standin.requests[0]
        assert path == "/api/generate"
        assert body["options"] == {"num_thread": 3, "num_ctx": 1024}
        assert body["keep_alive"] == -1
        standin.loaded = True
        await asyncio.sleep(1.05)  # readiness is cached for a second
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 200


async def test_metrics_carry_engine_timings_and_outcomes(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.001, tokens=8))
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            async with session.post(
                rig.url + "/api/generate", json={"prompt": "one two three", "stream": stream}
            ) as resp:
                await resp.read()
        async with session.post(rig.url + "/api/generate", data=b"nope") as resp:
            assert resp.status == 400
        async with session.get(rig.admin_url + "/metrics") as resp:
            assert resp.content_type == "text/plain"
            text = await resp.text()
    assert (
        'localmodel_gateway_requests_total{route="/api/generate",priority="foreground",'
        'outcome="ok"} 2'
    ) in text
    assert 'outcome="bad_request"} 1' in text
    assert "localmodel_gateway_generated_tokens_total 16" in text
    assert "localmodel_gateway_prompt_tokens_total" in text
    assert "localmodel_gateway_decode_seconds_total" in text
    assert 'localmodel_gateway_time_to_first_token_seconds_count{route="/api/generate"} 2' in text
    assert 'localmodel_gateway_queue_wait_seconds_count{priority="foreground"} 2' in text
    docs = rig.log_docs()
    assert len(docs) == 3  # one line per request
    assert docs[0]["decode_tok_s"] is not None and docs[0]["prefill_tok_s"] is not None
    assert docs[0]["queue_wait_ms"] is not None


# ---- speed: calibration at readiness, recent rates ----------------------------


async def test_readyz_waits_for_a_calibration_with_the_owned_settings(
    make_rig: RigFactory,
) -> None:
    standin = StandinOllama(token_delay=0.02, tokens=100)
    rig = await make_rig(standin, threads=3, context=1024, calibrate_tokens=32)
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 503
            assert "calibrating" in (await resp.json())["reason"]
        await wait_until(lambda: rig.gateway.gateway.speed.calibration is not None)
        await asyncio.sleep(1.05)  # readiness is cached for a second
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 200
        async with session.get(rig.admin_url + "/speed") as resp:
            doc = await resp.json()
    path, body = standin.requests[0]
    assert path == "/api/generate" and body["raw"] is True and body["stream"] is True
    assert body["options"] == {"num_thread": 3, "num_ctx": 1024, "num_predict": 32,
                               "temperature": 0, "seed": 0}
    cal = doc["calibration"]
    # The stand-in's own timing fields: 32 tokens at 0.02 s each.
    assert cal["generated_tokens"] == 32 and cal["complete"] is True
    assert cal["decode_tokens_per_second"] == pytest.approx(50.0)
    assert doc["calibrating"] is False and doc["threads"] == 3
    # The calibration is not traffic.
    assert doc["totals"]["requests"] == 0 and doc["recent"]["requests"] == 0


async def test_a_calibration_past_its_deadline_counts_the_tokens_it_saw(
    make_rig: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localmodel.gateway import readiness

    monkeypatch.setattr(readiness, "CALIBRATION_DEADLINE_SECONDS", 0.5)
    rig = await make_rig(StandinOllama(token_delay=0.05, tokens=100), calibrate_tokens=32)
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 503
        await wait_until(lambda: rig.gateway.gateway.speed.calibration is not None)
        await asyncio.sleep(1.05)
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 200  # a pod is never held back for want of a number
        async with session.get(rig.admin_url + "/speed") as resp:
            cal = (await resp.json())["calibration"]
    assert cal["complete"] is False and "stopped after 0.5 s" in cal["error"]
    assert 3 <= cal["generated_tokens"] <= 11
    assert cal["decode_tokens_per_second"] == pytest.approx(20.0, rel=0.35)


async def test_speed_and_metrics_carry_recent_rates_of_all_traffic(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=10))
    async with aiohttp.ClientSession() as session:
        for priority in ("foreground", "background"):
            async with session.post(rig.url + "/api/generate", json={"prompt": "a b"},
                                    headers={"X-Priority": priority}) as resp:
                await resp.read()
        async with session.get(rig.admin_url + "/speed") as resp:
            doc = await resp.json()
        async with session.get(rig.admin_url + "/metrics") as resp:
            text = await resp.text()
    assert doc["totals"]["requests"] == 2 and doc["totals"]["generated_tokens"] == 20
    assert doc["recent"]["requests"] == 2
    assert doc["recent"]["decode_tokens_per_second"] == pytest.approx(100.0)
    assert doc["calibration"] is None  # calibration off in this rig
    assert 'localmodel_gateway_recent_tokens_per_second{phase="decode"} 100' in text
    assert "localmodel_gateway_calibration_tokens_per_second{" not in text
