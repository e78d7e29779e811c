"""The operator's reads of a real gateway's speed (controller/speed.py `SpeedReader`)
against a gateway in front of the Ollama stand-in: the calibration read at
readiness, traffic between reads, a replica that does not answer, and the
counters the operator exports."""

from __future__ import annotations

import asyncio

import aiohttp

from localmodel.controller.speed import ReadCounters, SpeedBook, SpeedReader, SpeedTarget
from localmodel.speed import SOURCE_OWN, PeerKey, SpeedPolicy
from tests.gateway.harness import RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

KEY = PeerKey("standin:1b", "img", 2, ("GenuineIntel", "6", "143"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
        reader = SpeedReader(book, ReadCounters(), lambda: changes.append(1), clock, rig.port)
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
    assert counters.read_bytes.value() > 200 and counters.reads.value(("failed",)) == 0


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
    assert reader.counters.reads.value(("failed",)) == 2
    assert book.published_by_model() == {}
