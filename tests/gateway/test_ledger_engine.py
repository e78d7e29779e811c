"""The field report in miniature, against the REAL llama-server (one slot, one
thread; built by hack/build-engines.sh, serving the Gemma 3 270M GGUF) behind
the gateway, with the official `openai` client as every caller:

- a session whose prompts grow and then are compacted twice;
- a background caller whose non-streaming request times out on the client,
  which retries;
- a foreground question arriving while the background work holds the slot.

Each fact of the ledger is checked against a source outside the gateway: the
engine's `/slots` (polled every few ms: when each task held the slot), the
engine's own `timings` in the answers the callers got, and the callers' own
clocks. Then `localmodel timeline --gateway-url` reads it back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from localmodel.gateway.server import RunningGateway, start_gateway
from localmodel.gateway_contract import GatewayConfig
from tests.gateway.llama import engine_slots, llama_server, wait_engine
from tests.harness.engines import LlamaServer

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}
HISTORY = " ".join(
    f"Log line {i}: the job {i} finished in {i * 7 % 13} minutes." for i in range(30)
)
SUMMARY = [
    "Summary so far: thirty jobs ran, each within thirteen minutes; none failed. " * 4,
    "Summary so far: the jobs all finished; the slowest took twelve minutes. " * 4,
]
BACKGROUND_TIMEOUT = 4.0  # the background caller's client gives up after this long
QUESTION_AFTER = 1.5  # the foreground question arrives this long into the background work


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(tmp_path_factory.mktemp("ledger-engine"), slots=1) as running:
        yield running


@pytest.fixture
async def gateway(engine: LlamaServer) -> AsyncIterator[RunningGateway]:
    config = GatewayConfig(
        upstream=engine.url, engine="llama-server", listen_host="127.0.0.1", listen_port=0,
        slots=1, max_tokens=4096,
    )
    running = await start_gateway(config, lambda line: None)
    yield running
    await running.stop()
    async with aiohttp.ClientSession() as session:
        await wait_engine(session, engine, 0)


def client(gw: RunningGateway, caller: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=gw.url + "/v1",
        api_key="unused",
        default_headers={"X-LocalModel-Caller": caller, **headers},
        max_retries=0,
    )


@dataclass
class SlotWatch:
    """The engine's own view of its one slot, polled: (time, task) spans."""

    spans: list[list[float]] = field(default_factory=list)  # [task, start, end]

    async def run(self, engine: LlamaServer, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            current: int | None = None
            while not stop.is_set():
                [slot] = await engine_slots(session, engine)
                now = time.monotonic()
                task = int(slot["id_task"]) if slot.get("is_processing") else None
                if task != current:
                    if current is not None:
                        self.spans[-1][2] = now
                    if task is not None:
                        self.spans.append([task, now, now])
                    current = task
                await asyncio.sleep(0.01)

    def busy_at(self, at: float) -> list[float]:
        return next(s for s in self.spans if s[1] <= at <= s[2])


async def session_with_two_compactions(
    gw: RunningGateway, engine: LlamaServer
) -> list[dict[str, Any]]:
    """Six turns of one session: it grows, is compacted, grows, is compacted
    again. Returns each answer's engine timings as the caller got them. A turn
    the gateway refuses fails with its answer, the ledger's record of it and
    the engine's log (CI once saw one refused, with nothing else to go on)."""
    turns = []
    async with client(gw, "agent", **{"X-LocalModel-Session": "s1"}) as agent:
        messages: list[Any] = [SYSTEM, {"role": "user", "content": HISTORY}]
        plan = ["grow", "grow", "compact", "grow", "compact", "grow"]
        for step, what in enumerate(plan):
            if what == "compact":
                summary = SUMMARY[0 if step == 2 else 1]
                messages = [SYSTEM, {"role": "user", "content": summary}]
            try:
                answer = await agent.chat.completions.create(
                    model="gemma", messages=messages, max_tokens=8, temperature=0
                )
            except openai.APIStatusError as exc:
                raise AssertionError(
                    f"turn {step} ({what}): the gateway answered {exc.status_code} "
                    f"{exc.response.text[:500]}\nits record: {await last_record(gw)}\n"
                    f"the engine's log:\n{engine.process.log_tail(40)}"
                ) from exc
            timings = (answer.model_extra or {})["timings"]
            turns.append({"what": what, "timings": timings})
            reply = answer.choices[0].message.content or "ok"
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"And job {step}?"},
            ]
    return turns


async def last_record(gw: RunningGateway) -> Any:
    async with aiohttp.ClientSession() as session, session.get(gw.admin_url + "/ledger") as resp:
        entries = (await resp.json())["entries"]
    return entries[-1] if entries else None


async def background_and_question(
    gw: RunningGateway, engine: LlamaServer
) -> dict[str, Any]:
    """The indexer's long non-streaming request times out on its client, which
    retries; alice's question arrives while the indexer holds the slot."""
    out: dict[str, Any] = {}

    async def indexer() -> None:
        async with openai.AsyncOpenAI(
            base_url=gw.url + "/v1",
            api_key="unused",
            default_headers={"X-LocalModel-Caller": "indexer", "X-Priority": "background"},
            timeout=BACKGROUND_TIMEOUT,
            max_retries=1,
        ) as bg:
            with pytest.raises(openai.APIError) as failed:
                await bg.chat.completions.create(
                    model="gemma",
                    messages=[{"role": "user", "content": "Write a very long story."}],
                    max_tokens=3000,
                    extra_body={"ignore_eos": True},
                )
            out["indexer_error"] = type(failed.value).__name__

    async def alice() -> None:
        async with aiohttp.ClientSession() as session:
            await wait_engine(session, engine, 1)
        await asyncio.sleep(QUESTION_AFTER)
        async with client(gw, "alice") as fg:
            out["sent"] = time.monotonic()
            answer = await fg.chat.completions.create(
                model="gemma",
                messages=[{"role": "user", "content": "Name three colours."}],
                max_tokens=32,
                temperature=0,
            )
            out["answered"] = time.monotonic()
            out["timings"] = (answer.model_extra or {})["timings"]

    await asyncio.gather(indexer(), alice())
    return out


async def test_field_report_in_miniature(
    engine: LlamaServer, gateway: RunningGateway
) -> None:
    gw = gateway
    stop = asyncio.Event()
    watch = SlotWatch()
    watcher = asyncio.create_task(watch.run(engine, stop))
    wall_offset = time.time() - time.monotonic()
    try:
        turns = await session_with_two_compactions(gw, engine)
        contention = await background_and_question(gw, engine)
    finally:
        stop.set()
        await watcher
    async with aiohttp.ClientSession() as session, session.get(gw.admin_url + "/ledger") as resp:
        doc = await resp.json()
    entries = doc["entries"]

    # ---- re-reads: the two compactions, against the engine's prefill timings
    s1 = [e for e in entries if e["session"] == "s1"]
    assert [e["rewrite"] for e in s1] == [t["what"] == "compact" for t in turns]
    for entry, turn in zip(s1, turns, strict=True):
        t = turn["timings"]
        assert (entry["cached_tokens"], entry["evaluated_tokens"]) == (t["cache_n"], t["prompt_n"])
        assert entry["prefill_s"] == pytest.approx(t["prompt_ms"] / 1000, abs=1e-3)
        if turn["what"] == "compact":
            print(
                f"rewrite: re-read {entry['reread_s']:.3f} s ({entry['reread_tokens']} tokens); "
                f"engine prefill {t['prompt_ms'] / 1000:.3f} s ({t['prompt_n']} tokens, "
                f"{t['cache_n']} cached)"
            )
            assert entry["reread_s"] == pytest.approx(t["prompt_ms"] / 1000, rel=0.10)
            assert entry["reread_tokens"] > 50
        else:
            assert entry["reread_s"] == 0.0
            if turn is not turns[0]:
                assert t["cache_n"] > t["prompt_n"], "an extended prompt reused the cache"

    # ---- waited behind: the question's wait, against the engine's slot
    [question] = [e for e in entries if e["caller"] == "alice"]
    # The indexer's first try held the slot until its client gave up; its
    # retry found the slot taken (429: background is not queued) or, if the
    # question was answered by then, held it until the client gave up again.
    held, retry = [e for e in entries if e["caller"] == "indexer"]
    assert held["outcome"] == "cancelled_disconnect"
    assert retry["outcome"] in ("rejected_busy", "cancelled_disconnect")
    gone = sum(e["outcome"] == "cancelled_disconnect" for e in entries)
    sent = contention["sent"]
    background_span = watch.busy_at(sent)
    engine_wait = background_span[2] - sent  # the engine worked for the indexer meanwhile
    [behind] = question["waited_behind"]
    print(
        f"question waited {question['queue_wait_s']:.3f} s, behind indexer "
        f"{behind['seconds']:.3f} s; the engine held the slot for the indexer "
        f"{engine_wait:.3f} s after the question was sent"
    )
    assert (behind["caller"], behind["priority"]) == ("indexer", "background")
    assert behind["seconds"] == pytest.approx(engine_wait, rel=0.10)
    assert behind["seconds"] == pytest.approx(question["queue_wait_s"], abs=0.005)
    # The ledger's own slot times for the indexer, against the engine's.
    slot_start = held["arrival"] + held["slot_start_s"] - wall_offset
    assert slot_start == pytest.approx(background_span[1], abs=0.1)
    engine_held = background_span[2] - background_span[1]
    assert held["slot_s"] == pytest.approx(engine_held, rel=0.10)
    assert held["abandoned_s"] < 0.05  # the gateway let go as the caller left
    assert held["caller_gone_s"] == pytest.approx(BACKGROUND_TIMEOUT, abs=0.5)

    # ---- the question's wall time in parts
    wall = contention["answered"] - sent
    t = contention["timings"]
    parts = question["queue_wait_s"] + t["prompt_ms"] / 1000 + t["predicted_ms"] / 1000
    print(f"question wall {wall:.3f} s; queue + prefill + decode {parts:.3f} s")
    assert parts == pytest.approx(wall, rel=0.05)
    assert question["duration_s"] == pytest.approx(wall, rel=0.05)

    # ---- localmodel timeline reads it back
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    cmd = [sys.executable, "-m", "localmodel.cli", "timeline", "chat", "--gateway-url",
           gw.admin_url]
    out = await asyncio.to_thread(
        subprocess.run, [*cmd, "-o", "json"], capture_output=True, text=True, env=env, check=True
    )
    data = json.loads(out.stdout)
    assert data["queueing"]["behind"][0] == {
        "caller": "indexer", "priority": "background", "seconds": round(behind["seconds"], 3)
    }
    assert data["rereads"]["rewrites"] == 2
    reread_total = sum(e["reread_s"] for e in s1)
    assert data["rereads"]["seconds"] == pytest.approx(reread_total, abs=0.002)
    assert data["abandoned"]["requests"] == gone
    assert data["abandoned"]["held_after_gone_s"] < 0.05
    [mine] = [s for s in data["slowest"] if s["caller"] == "alice"]
    assert mine["queue_s"] == pytest.approx(question["queue_wait_s"], abs=0.002)
    table = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, env=env, check=True
    )
    text = table.stdout
    print(text)
    order = [text.index(f"{n}. ") for n in range(1, 8)]
    assert order == sorted(order)
    assert f"indexer (background) {behind['seconds']:.2f} s" in text
    assert "2 rewritten prompts" in text
    assert f"{gone} request{'s' if gone > 1 else ''} whose caller left" in text
