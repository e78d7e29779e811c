"""The gateway's Ollama routes in front of the REAL Ollama (built by
hack/build-engines.sh, serving the Gemma 3 270M GGUF as the operator's tuned
model), with the official `ollama` and `openai` Python clients among the
callers. The same routes against the stand-in are in test_gateway_standin.py.

"The engine stopped" is read from Ollama's llama-server child: its CPU time
stops growing. "No reload" is the same child process before and after.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from localmodel.engines.ollama import VERSION_PATH
from localmodel.gateway.server import RunningGateway, start_gateway
from localmodel.gateway_contract import GatewayConfig
from tests.engines.real_ollama import MODEL, copy_volume, cpu_seconds, import_gguf, wait_idle
from tests.gateway.harness import RawClient, wait_until
from tests.harness.engines import Ollama, ollama_serve

pytestmark = pytest.mark.engine

TUNED = "tuned:latest"
CONTEXT = 1024
LONG_PROMPT = "Count from 1 to 2000, separated by commas: 1, 2, 3,"
LONG_OPTIONS = {"num_predict": 3000, "temperature": 0, "seed": 1}
# The control below shows this generation still running after CONTROL_FOR
# seconds; every cancellation here must stop the engine well before that.
CONTROL_FOR = 10.0
STOP_WITHIN = 6.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ollama]:
    work = tmp_path_factory.mktemp("real-ollama")
    volume = work / "volume"
    import_gguf(work / "import", volume)
    models = work / "models"
    copy_volume(volume, models)
    env = {"OLLAMA_KEEP_ALIVE": "-1", "OLLAMA_NUM_PARALLEL": "1", "OLLAMA_MAX_LOADED_MODELS": "1"}
    with ollama_serve(work / "serve", models, env) as server:
        modelfile = work / "Tuned.Modelfile"
        modelfile.write_text(f"FROM {MODEL}\nPARAMETER num_ctx {CONTEXT}\nPARAMETER num_thread 1\n")
        done = server.cli("create", TUNED, "-f", str(modelfile))
        assert done.returncode == 0, done.stdout + done.stderr
        yield server


@pytest.fixture
async def gateway(engine: Ollama) -> AsyncIterator[tuple[RunningGateway, list[str]]]:
    config = GatewayConfig(
        upstream=engine.url,
        engine="ollama",
        listen_host="127.0.0.1",
        listen_port=0,
        model=TUNED,
        threads=1,
        context=CONTEXT,
        max_tokens=4096,
    )
    log: list[str] = []
    running = await start_gateway(config, log.append)
    # Ready means the model is loaded with the pod's settings.
    end = time.monotonic() + 180
    async with httpx.AsyncClient() as http:
        while (await http.get(running.url + "/readyz")).status_code != 200:
            assert time.monotonic() < end, "gateway never ready:\n" + engine.log_text()[-3000:]
            await asyncio.sleep(0.5)
    yield running, log
    await running.stop()
    await asyncio.to_thread(wait_idle, engine.runner(), 60)


async def _busy(engine: Ollama, start: float, timeout: float = 120.0) -> None:
    """Until the child has spent 0.5 CPU seconds since `start` (its CPU time
    then): past the prompt, into generation. Cumulative, so a loaded machine
    only makes it slower."""
    child = engine.runner()
    end = time.monotonic() + timeout
    while cpu_seconds(child) - start < 0.5:
        assert time.monotonic() < end, "the engine never got busy"
        await asyncio.sleep(0.1)


async def _stopped(engine: Ollama, left: float, what: str) -> None:
    idle = await asyncio.to_thread(wait_idle, engine.runner(), STOP_WITHIN, 0.5, 0.05)
    print(f"{what}: real Ollama idle within {idle:.1f} s of the caller leaving")
    assert time.monotonic() - left < STOP_WITHIN + 1


async def test_official_ollama_client_through_the_gateway(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    gw, _ = gateway
    child = engine.runner().pid
    client = ollama.AsyncClient(host=gw.url)
    # Options a caller must not be able to impose: the gateway owns them, so
    # the model is not reloaded.
    answer = await client.generate(
        model=TUNED,
        prompt="Say hi.",
        options={"num_predict": 8, "num_thread": 8, "num_ctx": 100000},
    )
    assert answer.done and answer.response
    assert answer.eval_count and answer.eval_count <= 8
    # Each of these reloads a real Ollama when it reaches it directly
    # (tests/engines/test_ollama_facts.py::test_a_different_option_reloads_the_model).
    for options in ({"num_ctx": 512}, {"num_batch": 64}, {"num_thread": 2}):
        again = await client.generate(
            model=TUNED, prompt="Say hi.", options={"num_predict": 2, **options}
        )
        assert again.done
    parts = []
    async for chunk in await client.chat(
        model=TUNED,
        messages=[{"role": "user", "content": "Say hi."}],
        stream=True,
        options={"num_predict": 8},
    ):
        parts.append(chunk)
    assert parts[-1].done and len(parts) > 1
    assert "".join(p.message.content or "" for p in parts)
    shown = await client.show(TUNED)
    assert f"num_ctx {CONTEXT}" in " ".join((shown.parameters or "").split())
    loaded = await client.ps()
    assert [m.model for m in loaded.models] == [TUNED]
    assert loaded.models[0].context_length == CONTEXT
    assert engine.runner().pid == child, "a request through the gateway reloaded the model"


async def test_openai_client_through_the_gateway_on_ollama(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    gw, _ = gateway
    # Closed here: an AsyncOpenAI left to the garbage collector schedules its
    # aclose() on whatever loop runs then (a later test's), which fails there.
    async with openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key="unused", max_retries=0
    ) as client:
        done = await client.chat.completions.create(
            model=TUNED, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
        )
        assert done.choices[0].message.content
        assert done.usage is not None and 0 < done.usage.completion_tokens <= 8
        stream = await client.chat.completions.create(
            model=TUNED,
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=8,
            stream=True,
        )
        text = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(text)


async def test_a_callers_keep_alive_never_unloads_the_model_of_real_ollama(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    """keep_alive is the pod's: a caller's 0 (which makes Ollama unload the
    model once the request ends, the control below) reaches the engine as the
    pod's -1 on the native routes and not at all on the OpenAI ones."""
    gw, _ = gateway
    child = engine.runner().pid
    client = ollama.AsyncClient(host=gw.url)
    assert (await client.generate(model=TUNED, prompt="Hi.", keep_alive=0,
                                  options={"num_predict": 2})).done
    assert (await client.chat(model=TUNED, messages=[{"role": "user", "content": "Hi."}],
                              keep_alive="0s", options={"num_predict": 2})).done
    async with openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key="unused", max_retries=0
    ) as oai:
        done = await oai.chat.completions.create(
            model=TUNED, messages=[{"role": "user", "content": "Hi."}], max_tokens=2,
            extra_body={"keep_alive": 0},
        )
        assert done.choices[0].message.content is not None
    await asyncio.sleep(5)  # the control below unloads well within this
    loaded = await client.ps()
    assert [m.model for m in loaded.models] == [TUNED]
    assert engine.runner().pid == child, "a caller's keep_alive unloaded the model"
    async with httpx.AsyncClient() as metrics:
        text = (await metrics.get(gw.admin_url + "/metrics")).text
    assert 'localmodel_gateway_options_rewritten_total{option="keep_alive"} 3' in text
    # The control: the same keep_alive sent to Ollama directly unloads it.
    direct = ollama.AsyncClient(host=engine.url)
    assert (await direct.generate(model=TUNED, prompt="Hi.", keep_alive=0,
                                  options={"num_predict": 2, "num_thread": 1,
                                           "num_ctx": CONTEXT})).done
    start = time.monotonic()
    await wait_until(lambda: not engine.runners(), timeout=60, step=0.2)
    print(f"control: keep_alive 0 sent directly unloaded the model in "
          f"{time.monotonic() - start:.1f} s")
    # Loaded again with the pod's settings, for the tests after this one.
    assert (await client.generate(model=TUNED, prompt="Hi.", options={"num_predict": 1})).done


async def test_streaming_ollama_client_that_leaves_stops_real_ollama(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    """Also the control for the other cancellation tests: after CONTROL_FOR
    seconds the long generation is still producing tokens."""
    gw, log = gateway
    client = ollama.AsyncClient(host=gw.url)
    stream = await client.generate(
        model=TUNED, prompt=LONG_PROMPT, options=LONG_OPTIONS, stream=True
    )
    started = time.monotonic()
    async for chunk in stream:
        assert not chunk.done, "the long generation ended early: pick a longer one"
        if time.monotonic() - started > CONTROL_FOR:
            break
    left = time.monotonic()
    await stream.aclose()
    await _stopped(engine, left, "streaming ollama client leaves")
    await wait_until(lambda: len(log) == 1, timeout=10)
    assert json.loads(log[0])["cancel_reason"] == "disconnect"


async def test_non_streaming_caller_that_leaves_stops_real_ollama(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    gw, log = gateway
    body: dict[str, Any] = {
        "model": TUNED,
        "prompt": LONG_PROMPT,
        "options": LONG_OPTIONS,
        "stream": False,
    }
    start = cpu_seconds(engine.runner())
    caller = await RawClient.send(gw.port, "/api/generate", body)
    await _busy(engine, start)
    left = time.monotonic()
    caller.close()
    await _stopped(engine, left, "non-streaming caller leaves")
    await wait_until(lambda: len(log) == 1, timeout=10)
    assert json.loads(log[0])["cancel_reason"] == "disconnect"


async def test_ollama_client_timeout_stops_real_ollama(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    """The official client with a timeout, non-streaming: when it gives up,
    the engine stops too."""
    gw, _ = gateway
    client = ollama.AsyncClient(host=gw.url, timeout=4.0)
    with pytest.raises(httpx.TimeoutException):
        await client.generate(model=TUNED, prompt=LONG_PROMPT, options=LONG_OPTIONS)
    await _stopped(engine, time.monotonic(), "ollama client timeout")


def test_the_engine_fixture_is_the_real_ollama(engine: Ollama) -> None:
    status, version = engine.api(VERSION_PATH)
    assert status == 200 and version["version"] != "0.0.0"
    assert Path(engine.runner().exe()).name == "llama-server"


async def test_ready_only_after_a_calibration_with_the_pods_settings(
    gateway: tuple[RunningGateway, list[str]],
) -> None:
    """The real Ollama's own timing of the 32-token calibration, measured before
    /readyz said 200 (docs/gateway.md, Speed); not counted as traffic."""
    running, _ = gateway
    async with httpx.AsyncClient() as http:
        doc = (await http.get(running.admin_url + "/speed")).json()
    calibration = doc["calibration"]
    print(f"real Ollama calibration: {calibration}")
    assert calibration["complete"] is True and calibration["error"] is None, calibration
    assert 0 < calibration["generated_tokens"] <= 32, calibration
    assert calibration["decode_tokens_per_second"] > 0.5, calibration
    assert calibration["prefill_tokens_per_second"] > 0, calibration
    assert doc["totals"]["requests"] == 0 and doc["threads"] == 1


HISTORY = " ".join(f"Log line {i}: job {i} took {i * 7 % 13} minutes." for i in range(25))
SUMMARY = "Summary so far: twenty-five jobs ran, each within thirteen minutes. " * 3


async def _ledger(gw: RunningGateway, **params: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(gw.admin_url + "/ledger", params=params)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


async def test_ledger_on_real_ollama_says_what_it_reports(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    """Ollama's native route reports the whole prompt, the cached part and the
    prefill time (docs/engine-facts.md, Prompt cache accounting), so the ledger
    has every fact there: cache reuse, rewrites and their re-read seconds
    against the prefill the caller saw."""
    gw, _ = gateway
    system = {"role": "system", "content": "Answer in one word."}
    headers = {"X-LocalModel-Caller": "agent", "X-LocalModel-Session": "s1"}
    client = ollama.AsyncClient(host=gw.url, headers=headers)
    messages: list[dict[str, str]] = [system, {"role": "user", "content": HISTORY}]
    plan = ["grow", "grow", "compact", "grow"]
    answers = []
    for step, what in enumerate(plan):
        if what == "compact":
            messages = [system, {"role": "user", "content": SUMMARY}]
        answer = await client.chat(
            model=TUNED, messages=messages, options={"num_predict": 4, "temperature": 0}
        )
        answers.append(answer)
        messages = [
            *messages,
            {"role": "assistant", "content": answer.message.content or "ok"},
            {"role": "user", "content": f"And job {step}?"},
        ]
    entries = await _ledger(gw, caller="agent")
    assert [e["rewrite"] for e in entries] == [w == "compact" for w in plan]
    for entry, answer in zip(entries, answers, strict=True):
        assert entry["prompt_tokens"] == answer.prompt_eval_count
        assert entry["cached_tokens"] + entry["evaluated_tokens"] == answer.prompt_eval_count
        assert answer.prompt_eval_duration is not None
        assert entry["prefill_s"] == pytest.approx(answer.prompt_eval_duration / 1e9, abs=1e-3)
    extended = entries[1]
    assert extended["cached_tokens"] >= (answers[0].prompt_eval_count or 0) - 5
    compacted, prompt = entries[2], answers[2]
    assert prompt.prompt_eval_duration is not None
    print(
        f"ollama rewrite: re-read {compacted['reread_s']:.3f} s ({compacted['reread_tokens']} "
        f"tokens), engine prefill {prompt.prompt_eval_duration / 1e9:.3f} s"
    )
    assert compacted["reread_s"] == pytest.approx(prompt.prompt_eval_duration / 1e9, rel=0.10)
    assert compacted["reread_tokens"] == compacted["evaluated_tokens"]


async def test_ledger_on_real_ollama_attributes_the_wait(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    gw, _ = gateway
    body: dict[str, Any] = {
        "model": TUNED, "prompt": LONG_PROMPT, "options": LONG_OPTIONS, "stream": False
    }
    start = cpu_seconds(engine.runner())
    holder = await RawClient.send(
        gw.port, "/api/generate", body,
        {"X-LocalModel-Caller": "indexer", "X-Priority": "background"},
    )
    await _busy(engine, start)
    client = ollama.AsyncClient(host=gw.url, headers={"X-LocalModel-Caller": "alice"})
    sent = time.monotonic()
    question = asyncio.create_task(
        client.generate(model=TUNED, prompt="Say hi.", options={"num_predict": 4})
    )
    await asyncio.sleep(2.0)
    left = time.monotonic()
    holder.close()  # the background caller gives up: alice gets the slot
    answer = await question
    assert answer.done
    [alice] = await _ledger(gw, caller="alice")
    [indexer] = await _ledger(gw, caller="indexer")
    [behind] = alice["waited_behind"]
    print(f"ollama: alice waited {alice['queue_wait_s']:.3f} s, behind {behind}")
    assert (behind["caller"], behind["priority"]) == ("indexer", "background")
    assert behind["seconds"] == pytest.approx(left - sent, rel=0.10)
    assert indexer["outcome"] == "cancelled_disconnect" and indexer["abandoned_s"] < 0.05


async def test_ledger_on_ollamas_openai_route_says_unknown(
    engine: Ollama, gateway: tuple[RunningGateway, list[str]]
) -> None:
    """Ollama's OpenAI-compatible route reports token counts (cached ones
    included) but no prefill time: the ledger says so (null), and a rewrite's
    re-read seconds are unknown rather than guessed."""
    gw, _ = gateway
    async with openai.AsyncOpenAI(
        base_url=gw.url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"X-LocalModel-Session": "s2"},
    ) as client:
        for content in (HISTORY, SUMMARY):
            done = await client.chat.completions.create(
                model=TUNED, messages=[{"role": "user", "content": content}], max_tokens=2,
                user="scripted",
            )
            assert done.usage is not None
    first, rewritten = await _ledger(gw, caller="scripted")
    assert first["prompt_tokens"] == first["cached_tokens"] + first["evaluated_tokens"]
    assert first["prefill_s"] is None and first["decode_s"] is None
    assert rewritten["rewrite"] is True
    # The tokens re-read are known from the counts; their seconds are not.
    assert rewritten["reread_s"] is None and rewritten["reread_tokens"] > 0
