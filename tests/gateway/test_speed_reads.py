"""The operator's reads of a real gateway's speed (controller/speed.py `SpeedReader`)
against a gateway in front of the Ollama stand-in: the calibration read at
readiness, traffic between reads, a replica that does not answer, and the
counters the operator exports. Replicas that do not answer (a silent gateway,
a refused connection, a wrong answer) on loopback addresses of their own
(127.0.0.x, one port) stand for pod IPs."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import aiohttp
import pytest

from localmodel.controller import speed
from localmodel.controller.speed import ReadCounters, SpeedBook, SpeedReader, SpeedTarget
from localmodel.gateway.server import start_gateway
from localmodel.gateway_contract import GatewayConfig
from localmodel.speed import SOURCE_OWN, PeerKey, SpeedPolicy
from tests.gateway.harness import RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama
from tests.harness.clock import Clock
from tests.harness.loopwatch import loop_stall_watch

KEY = PeerKey("standin:1b", "img", 2, ("GenuineIntel", "6", "143"))


async def test_reader_reads_calibration_then_traffic_and_counts_its_reads(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=40), calibrate_tokens=32)
    async with aiohttp.ClientSession() as session:
        async with session.get(rig.url + "/readyz") as resp:
            assert resp.status == 503  # the probe starts the calibration
        await wait_until(lambda: rig.gateway.gateway.speed.calibration is not None)
        book = SpeedBook(SpeedPolicy(interval=10, idle_max=20))
        clock = Clock()
        changes: list[int] = []
        reader = SpeedReader(book, ReadCounters(), lambda: changes.append(1), clock,
                             rig.gateway.admin_port)
        book.retarget([SpeedTarget("ai/chat", 0, "n0", "chat-0", "u0", "127.0.0.1", KEY)])
        async with reader.session():
            await reader.read_due()
            calibrated = book.published_by_model()["ai/chat"][0]
            assert calibrated.calibration.decode is not None
            assert abs(calibrated.calibration.decode - 100.0) < 1
            assert calibrated.expected.source == SOURCE_OWN and changes == [1]
            # Traffic between two reads: the rate of that interval.
            for _ in range(2):
                async with session.post(rig.url + "/api/generate", json={"prompt": "x"},
                                        headers={"X-Priority": "background"}) as resp:
                    await resp.read()
            clock.now += 10
            await reader.read_due()  # the readiness read found no traffic: idle_max later
            clock.now += 10
            await reader.read_due()
    u0 = book.by_uid["u0"]
    assert u0.recent.decode is not None and abs(u0.recent.decode - 100.0) < 1
    assert u0.state.ratio is not None and abs(u0.state.ratio - 1.0) < 0.02
    counters = reader.counters
    assert counters.reads.value(("ok",)) == 2
    assert counters.read_bytes.value() > 200
    assert all(counters.reads.value((r,)) == 0 for r in ("timeout", "unreachable", "bad_answer"))


async def test_a_replica_that_does_not_answer_is_counted_and_backed_off() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    book = SpeedBook(SpeedPolicy(interval=10, idle_max=20))
    clock = Clock()
    reader = SpeedReader(book, ReadCounters(), lambda: None, clock, port)
    book.retarget([SpeedTarget("ai/chat", 0, "n0", "chat-0", "u0", "127.0.0.1", KEY)])
    async with reader.session():
        await reader.read_due()
        clock.now += 10
        await reader.read_due()  # a failed read waits idle_max: not due yet
        clock.now += 10
        await reader.read_due()
    assert reader.counters.reads.value(("unreachable",)) == 2
    assert reader.counters.reads.value(("ok",)) == 0
    assert book.published_by_model() == {}


async def test_silent_replicas_cost_a_bounded_wait_and_never_fail_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twice the read concurrency of silent gateways (they accept and never
    answer), one refusing, one answering 404, and a real gateway listed last:
    each read gets the whole timeout once it starts (the real gateway's read,
    queued behind the silent ones, succeeds), no more than READ_CONCURRENCY
    are under way at once, the round ends within its waves of timeouts, each
    failure is counted by its kind, and the event loop (where the reconcile
    passes run) is never held up meanwhile."""
    timeout = 0.4
    monkeypatch.setattr(speed, "READ_TIMEOUT_SECONDS", timeout)
    gw = await start_gateway(GatewayConfig(listen_host="127.0.0.1", listen_port=0,
                                           calibrate_tokens=0), lambda line: None)
    port = gw.admin_port
    open_now, most_open, tried = 0, 0, 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most_open, tried
        tried += 1
        open_now += 1
        most_open = max(most_open, open_now)
        try:
            await reader.read()  # until the operator gives up and closes
        finally:
            open_now -= 1
            writer.close()

    async def not_found(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"
                         b"connection: close\r\n\r\n")
            await writer.drain()
        writer.close()

    servers = [await asyncio.start_server(silent, "127.0.0.2", port),
               await asyncio.start_server(not_found, "127.0.0.4", port)]
    n_silent = 2 * speed.READ_CONCURRENCY + 1
    targets = [SpeedTarget("ai/dead", i, "n", f"dead-{i}", f"d{i}", "127.0.0.2", KEY)
               for i in range(n_silent)]
    targets += [SpeedTarget("ai/refused", 0, "n", "refused-0", "r0", "127.0.0.3", KEY),
                SpeedTarget("ai/wrong", 0, "n", "wrong-0", "w0", "127.0.0.4", KEY),
                SpeedTarget("ai/chat", 0, "n", "chat-0", "u0", "127.0.0.1", KEY)]
    book = SpeedBook(SpeedPolicy(interval=10, idle_max=20))
    book.retarget(targets)
    clock = Clock()
    reader = SpeedReader(book, ReadCounters(), lambda: None, clock, port)
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    try:
        async with loop_stall_watch() as stall, reader.session():
            began = time.monotonic()
            await reader.read_due()
            took = time.monotonic() - began
    finally:
        asyncio.get_running_loop().set_exception_handler(None)
        for server in servers:
            server.close()
        await gw.stop()
    assert errors == []  # no callback failed (the reader's stall watch among them)
    reads = reader.counters.reads
    # Every silent replica was tried (none timed out waiting for a connection).
    assert tried == n_silent
    assert reads.value(("ok",)) == 1 and book.by_uid["u0"].reading is not None
    assert reads.value(("timeout",)) == n_silent
    assert reads.value(("unreachable",)) == 1 and reads.value(("bad_answer",)) == 1
    assert most_open == speed.READ_CONCURRENCY
    waves = math.ceil((n_silent + 3) / speed.READ_CONCURRENCY)
    assert took < waves * timeout + 1.0, (took, waves)
    assert stall.worst < 0.2, stall
    # Every failed replica waits idle_max for its next read; none is due now.
    assert book.due(clock.now + 10) == []
    assert len(book.due(clock.now + 20)) == len(targets)


async def test_a_pass_holding_the_event_loop_does_not_time_out_the_reads_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconcile passes compute on the reader's event loop (at 10k nodes, for
    seconds). Reads under way when a pass holds the loop for several times the
    read timeout, whose gateway answered meanwhile, are read, not timed out;
    a gateway that never answers still times out once the loop is free."""
    timeout = 0.3
    monkeypatch.setattr(speed, "READ_TIMEOUT_SECONDS", timeout)
    gw = await start_gateway(GatewayConfig(listen_host="127.0.0.1", listen_port=0,
                                           calibrate_tokens=0), lambda line: None)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    quiet = await asyncio.start_server(silent, "127.0.0.2", gw.admin_port)
    book = SpeedBook(SpeedPolicy(interval=10, idle_max=20))
    book.retarget([SpeedTarget("ai/chat", i, "n", f"chat-{i}", f"u{i}", "127.0.0.1", KEY)
                   for i in range(4)]
                  + [SpeedTarget("ai/dead", 0, "n", "dead-0", "d0", "127.0.0.2", KEY)])
    reader = SpeedReader(book, ReadCounters(), lambda: None, Clock(), gw.admin_port)
    try:
        async with reader.session():
            round_ = asyncio.create_task(reader.read_due())
            await asyncio.sleep(0.02)  # the requests are sent
            time.sleep(4 * timeout)  # a pass computing: the loop is held
            began = time.monotonic()
            await round_
            after = time.monotonic() - began
    finally:
        quiet.close()
        await gw.stop()
    reads = reader.counters.reads
    assert reads.value(("ok",)) == 4 and reads.value(("timeout",)) == 1
    # The silent one got its time after the stall, not before it.
    assert after >= timeout - speed.STALL_TICK_SECONDS - 0.05, after
