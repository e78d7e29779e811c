"""The operator's close caller (controller/closer.py `Closer`) against the
REAL gateway program (`localmodel gateway`, its own process, in front of the
tinyserve stand-in engine, as tests/gateway/test_door_process.py starts it):
a signed close is taken, renewed and undone; refused as busy while a request
is in flight (its body still being sent), with the gateway's counts;
forbidden with another key; unreachable where nothing listens. Then against
stand-ins: one call at a time per pod, and an answer too long or too slow is
one result, never an exception. No timed assertions."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.controller.closer import Closer
from localmodel.events import EventReason
from localmodel.gateway_contract import SPEED_PATH
from localmodel.gateway_contract.speed_answer import reading_from_answer
from localmodel.idle.asks import CloseAsk, CloseResult
from localmodel.idle.signals import CLOSE_ANSWER_MAX_BYTES
from tests.gateway.harness import wait_until
from tests.gateway.test_door_process import HERE, LEASE_S, OPERATOR, Served
from tests.gateway.test_door_process import served as served  # the fixture
from tests.harness.processes import free_ports

WAIT = 60.0
POD = f"{HERE[0]}/{HERE[1]}"


def ask(reason: str, idle: int = 0, ip: str = "127.0.0.1", pod: str = HERE[1]) -> CloseAsk:
    return CloseAsk(HERE[0], "tiny", pod, reason,  # type: ignore[arg-type]
                    idle, for_="team-a/waker" if reason == "yield" else "", ip=ip)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def activity(admin: str) -> Any:
    with urllib.request.urlopen(admin + SPEED_PATH, timeout=10) as resp:
        return reading_from_answer(resp.read(), 0.0, "u0").activity


@pytest.fixture
async def closer_of() -> AsyncIterator[Any]:
    made: list[tuple[Closer, asyncio.Task[None]]] = []

    async def make(port: int, key: Ed25519PrivateKey | None = OPERATOR,
                   leading: asyncio.Event | None = None, **kw: Any) -> Closer:
        changes = asyncio.Event()
        closer = Closer(lambda: key, changes.set, port=port, **kw)
        if leading is None:
            leading = asyncio.Event()
            leading.set()
        task = asyncio.create_task(closer.run(leading))
        await wait_until(lambda: closer._session is not None, timeout=WAIT)
        made.append((closer, task))
        return closer

    yield make
    for _, task in made:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def answered(closer: Closer, pod: str = POD) -> Any:
    await closer.idle()
    return closer.closes()[pod]


async def test_a_signed_close_is_taken_renewed_and_undone_by_the_gateway(
        served: Served, closer_of: Any) -> None:
    offset = [0.0]
    closer: Closer = await closer_of(port_of(served.admin),
                                     clock=lambda: time.time() + offset[0])
    closer.send([ask("sleep")])
    closed = await answered(closer)
    assert (closed.result, closed.lease_seconds) == (CloseResult.CLOSED, float(LEASE_S))
    assert activity(served.admin).closed is True
    # A third of the lease later, the close is renewed (a new mark, the same body).
    offset[0] = LEASE_S / 3 + 0.5
    closer.renew_due()
    renewed = await answered(closer)
    assert renewed.result is CloseResult.CLOSED and renewed.at > closed.at
    assert closer.yields.value(("closed",)) == 1  # a renewal is not a new close
    closer.send([ask("reopen")])
    assert (await answered(closer)).result is CloseResult.OPENED
    assert activity(served.admin).closed is False
    assert closer.take_events() == {}  # a sleep tells no Yielded


async def test_a_gateway_with_a_request_in_flight_answers_busy_with_its_counts(
        served: Served, closer_of: Any) -> None:
    closer: Closer = await closer_of(port_of(served.admin))
    # A caller whose body is still on its way: in flight at the gateway.
    _, writer = await asyncio.open_connection("127.0.0.1", port_of(served.url))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\"")
    await writer.drain()
    await wait_until(lambda: activity(served.admin).in_flight == 1, timeout=WAIT)
    closer.send([ask("yield", 0)])
    busy = await answered(closer)
    assert (busy.result, busy.in_flight, busy.queued) == (CloseResult.BUSY, 1, 0)
    assert activity(served.admin).closed is False
    [event] = closer.take_events()["team-a/tiny"]
    assert event.reason is EventReason.YIELD_REFUSED and "1 in flight" in event.message
    writer.close()
    await wait_until(lambda: activity(served.admin).in_flight == 0, timeout=WAIT)
    closer.send([ask("yield", 0)])
    assert (await answered(closer)).result is CloseResult.CLOSED
    [event] = closer.take_events()["team-a/tiny"]
    assert event.reason is EventReason.YIELDED and "team-a/waker" in event.message
    assert closer.yields.value(("busy",)) == 1 and closer.yields.value(("closed",)) == 1


async def test_another_key_is_forbidden_and_nowhere_is_unreachable(
        served: Served, closer_of: Any) -> None:
    stranger: Closer = await closer_of(port_of(served.admin), key=Ed25519PrivateKey.generate())
    stranger.send([ask("sleep")])
    assert (await answered(stranger)).result is CloseResult.FORBIDDEN
    assert activity(served.admin).closed is False
    keyless: Closer = await closer_of(port_of(served.admin), key=None)
    keyless.send([ask("sleep")])
    assert (await answered(keyless)).result is CloseResult.FORBIDDEN
    (nothing,) = free_ports(1)
    nowhere: Closer = await closer_of(nothing)
    nowhere.send([ask("sleep"), ask("sleep", pod="no-ip", ip=""),
                  ask("sleep", pod="not-ip", ip="evil.example/x#")])
    assert (await answered(nowhere)).result is CloseResult.UNREACHABLE
    assert (await answered(nowhere, f"{HERE[0]}/no-ip")).result is CloseResult.UNREACHABLE
    assert (await answered(nowhere, f"{HERE[0]}/not-ip")).result is CloseResult.UNREACHABLE


class StandIn:
    """A gateway admin port that answers as told, counting calls under way."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.under_way = 0
        self.most = 0
        self.bodies: list[Any] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.under_way += 1
        self.most = max(self.most, self.under_way)
        try:
            self.bodies.append(json.loads(await request.read()))
            if self.mode == "slow":
                await self.release.wait()
            elif self.mode == "huge":
                return web.json_response({"closed": True, "lease_seconds": 60,
                                          "pad": "x" * (CLOSE_ANSWER_MAX_BYTES * 16)})
            await asyncio.sleep(0.2)
            return web.json_response({"closed": True, "lease_seconds": 60})
        finally:
            self.under_way -= 1


@pytest.fixture
async def stand_in() -> AsyncIterator[Any]:
    runners: list[tuple[web.AppRunner, StandIn]] = []

    async def start(mode: str) -> tuple[StandIn, int]:
        s = StandIn(mode)
        app = web.Application()
        app.router.add_post("/yield", s.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append((runner, s))
        return s, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    yield start
    for runner, s in runners:
        s.release.set()
        await runner.cleanup()


async def test_one_call_at_a_time_per_pod_the_latest_waiting_ask_wins(
        stand_in: Any, closer_of: Any) -> None:
    s, port = await stand_in("ok")
    closer: Closer = await closer_of(port)
    closer.send([ask("sleep", 10), ask("sleep", 40, pod="other")])
    await wait_until(lambda: s.under_way == 2, timeout=WAIT)
    closer.send([ask("sleep", 20)])
    closer.send([ask("sleep", 30)])  # both wait for the call under way: the latest goes
    await closer.idle()
    assert s.most == 2  # one per pod
    mine = [b["idle_at_least"] for b in s.bodies if b["idle_at_least"] != 40]
    assert mine == [10, 30]  # the first, then the latest of those that waited


async def test_an_answer_too_long_is_bad_and_one_too_slow_unreachable(
        stand_in: Any, closer_of: Any) -> None:
    _, huge = await stand_in("huge")
    closer: Closer = await closer_of(huge)
    closer.send([ask("sleep")])
    assert (await answered(closer)).result is CloseResult.BAD
    _, slow = await stand_in("slow")
    closer = await closer_of(slow)
    closer.send([ask("sleep")])
    assert (await answered(closer)).result is CloseResult.UNREACHABLE


async def test_a_lost_lease_forgets_every_close_and_renews_none(
        stand_in: Any, closer_of: Any) -> None:
    s, port = await stand_in("ok")
    leading = asyncio.Event()
    leading.set()
    closer: Closer = await closer_of(port, leading=leading)
    closer.send([ask("sleep")])
    assert (await answered(closer)).result is CloseResult.CLOSED
    leading.clear()
    closer.wake.set()
    await wait_until(lambda: closer.closes() == {}, timeout=WAIT)
    closer.renew_due()
    await closer.idle()
    assert len(s.bodies) == 1  # nothing renewed
