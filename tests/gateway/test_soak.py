"""Soak: 2,000 requests on loopback through the gateway to the Ollama STAND-IN
(a test server speaking Ollama's NDJSON, not Ollama), 30% of callers vanishing
mid-request and 10% sending malformed bodies. Bounded in count (2,000) and
time (60 s). It must end with zero busy slots, an empty queue, nothing in
flight upstream, bounded memory and no unhandled exception."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from typing import Any

import aiohttp
import psutil

from tests.gateway.harness import RawClient, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

TOTAL = 2000
CONCURRENCY = 32
WARMUP = 300

ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/api/generate", {"prompt": "soak"}),
    ("/api/chat", {"messages": [{"role": "user", "content": "soak"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "soak"}]}),
    ("/v1/completions", {"prompt": "soak"}),
    ("/api/embed", {"input": ["soak"]}),
]


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_soak_ends_clean(make_rig: RigFactory) -> None:
    rng = random.Random(4)
    standin = StandinOllama(token_delay=0.001, tokens=6, keep_records=False)
    log_lines = 0

    def count_line(_: str) -> None:
        nonlocal log_lines
        log_lines += 1

    # Log lines are counted, not kept, so that memory stays flat.
    rig = await make_rig(standin, access_log=count_line, slots=2, max_queue=64)
    gateway = rig.gateway.gateway

    loop_errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    errors = _Errors()
    for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access", "asyncio"):
        logging.getLogger(name).addHandler(errors)

    statuses: Counter[int | str] = Counter()
    process = psutil.Process()
    rss: dict[str, int] = {}
    next_index = 0

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        path, body = ROUTES[rng.randrange(len(ROUTES))]
        body = dict(body, stream=rng.random() < 0.5)
        headers = {"X-Priority": "background"} if rng.random() < 0.2 else {}
        # Named callers and sessions: the ledger's books are in the soak too.
        headers["X-LocalModel-Caller"] = f"c{rng.randrange(100)}"
        headers["X-LocalModel-Session"] = f"s{rng.randrange(30)}"
        roll = rng.random()
        if roll < 0.10:
            raw = rng.choice([b"{bad json", b"[]", b"", b'{"model": 7}', b"\xff"])
            async with session.post(rig.url + path, data=raw, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] += 1
            return
        if roll < 0.40:
            client = await RawClient.send(rig.port, path, body, headers)
            await asyncio.sleep(rng.uniform(0, 0.02))
            client.close()
            statuses["disconnect"] += 1
            return
        async with session.post(rig.url + path, json=body, headers=headers) as resp:
            await resp.read()
            statuses[resp.status] += 1

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_index
        while next_index < TOTAL:
            i = next_index
            next_index += 1
            if i == WARMUP:
                rss["warm"] = process.memory_info().rss
            await one(session, i)

    try:
        async with asyncio.timeout(60), aiohttp.ClientSession() as session:
            await asyncio.gather(*[worker(session) for _ in range(CONCURRENCY)])
        await wait_until(lambda: gateway.in_flight == 0, timeout=5)
        await wait_until(lambda: standin.active == 0, timeout=5)
    finally:
        for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access", "asyncio"):
            logging.getLogger(name).removeHandler(errors)
        loop.set_exception_handler(None)
    rss["end"] = process.memory_info().rss

    snap = gateway.board.snapshot()
    assert (snap.busy, snap.queued) == (0, 0)
    assert gateway.waiters == 0
    assert gateway.queue.pending_accounts == 0  # the ledger's wait book drained too
    assert gateway.unexpected_errors == 0
    assert loop_errors == []
    assert [r.getMessage() for r in errors.records] == []
    assert sum(statuses.values()) == TOTAL
    assert set(statuses) <= {200, 400, 429, 503, "disconnect"}, statuses
    assert statuses[400] >= 0.05 * TOTAL
    assert statuses[200] >= 0.2 * TOTAL, statuses
    handled = sum(gateway.metrics.requests.values.values())
    assert handled == log_lines  # one log line per request the gateway saw
    assert gateway.ledger is not None and gateway.ledger.recorded == handled  # and one record
    assert handled >= TOTAL - statuses["disconnect"]
    assert "internal_error" not in {labels[2] for labels in gateway.metrics.requests.values}
    growth_mb = (rss["end"] - rss["warm"]) / 2**20
    assert growth_mb < 40, f"RSS grew {growth_mb:.1f} MiB after warm-up"
    print(
        f"soak: {dict(statuses)} handled={handled} rss_growth={growth_mb:.1f}MiB "
        f"cancellations={dict(gateway.metrics.cancellations.values)}"
    )
