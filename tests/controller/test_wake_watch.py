"""The operator's long polls of the routers' `GET /waiting`
(controller/wake_watch.py `WakeWatch`): against two REAL routers (the router
program in-process, holding requests for a model with `spec.idle` and no
replica, as tests/router/test_router_hold.py starts them) and hostile
stand-ins beside them (garbage, a huge answer, one that never answers, one
that is down). Held requests are summed over the real routers and follow
them as they change; the hostile ones count for nothing, are logged once and
asked again with backoff, and never hold the others up. No timed
assertions: every wait is on a condition, with generous bounds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from localmodel.controller.wake_watch import WakeWatch, slice_finder
from localmodel.gateway_contract.waiting_answer import MAX_BYTES
from localmodel.idle.signals import RouterPod
from localmodel.router.server import RunningRouter, start_router
from tests.gateway.harness import RawClient, wait_until
from tests.harness.processes import free_ports
from tests.router.test_router_hold import CONFIG, Cluster, ask, chat

WAIT = 30.0


class Hostile:
    """A stand-in at a router's address: `mode` says what it answers."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.asked = 0
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.released = asyncio.Event()  # the slow one's answer, at the end

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        if self.mode == "garbage":
            return web.Response(text="<html>not a router</html>")
        if self.mode == "huge":
            return web.Response(body=b'{"serial": 1, "models": [' + b" " * (MAX_BYTES * 4)
                                + b"]}")
        if self.mode == "redirect":
            raise web.HTTPFound("http://127.0.0.1:1/waiting")
        await self.released.wait()  # slow: answers only when the test ends
        return web.Response(status=503)

    async def start(self) -> RouterPod:
        app = web.Application()
        app.router.add_get("/waiting", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return RouterPod(f"hostile-{self.mode}", "127.0.0.1", self.port)


@pytest.fixture
async def routers() -> AsyncIterator[list[RunningRouter]]:
    started: list[RunningRouter] = []
    for _ in range(2):
        cluster = Cluster()
        cluster.model(chat({"idle": {"state": "Asleep"}}))
        started.append(await start_router(replace(CONFIG), cluster, lambda line: None))
    yield started
    for running in started:
        await running.stop()


def pod(running: RunningRouter, name: str) -> RouterPod:
    return RouterPod(name, running.host, running.admin_port)


async def hold(running: RunningRouter, n: int) -> list[RawClient]:
    return [await RawClient.send(running.port, "/api/chat", ask(f"wake {i}")) for i in range(n)]


def held(watch: WakeWatch, model: str = "ai/chat") -> int:
    m = watch.waiting().get(model)
    return m.held if m is not None else 0


async def test_held_requests_are_summed_over_routers_and_hostile_ones_count_for_nothing(
        routers: list[RunningRouter], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="localmodel.wake")
    hostiles = [Hostile(m) for m in ("garbage", "huge", "slow", "redirect")]
    (down_port,) = free_ports(1)
    pods = (pod(routers[0], "router-a"), pod(routers[1], "router-b"),
            *[await h.start() for h in hostiles], RouterPod("router-down", "127.0.0.1", down_port))
    changes = 0

    def changed() -> None:
        nonlocal changes
        changes += 1

    async def find() -> tuple[RouterPod, ...]:
        return pods

    watch = WakeWatch(find, changed, wait_s=5)
    leading = asyncio.Event()
    leading.set()
    task = asyncio.create_task(watch.run(leading))
    try:
        await wait_until(lambda: set(watch.routers()) == set(pods), timeout=WAIT)
        first = await hold(routers[0], 2)
        await wait_until(lambda: held(watch) == 2, timeout=WAIT)
        second = await hold(routers[1], 1)
        await wait_until(lambda: held(watch) == 3, timeout=WAIT)
        assert watch.waiting()["ai/chat"].foreground == 3 and changes >= 2
        first[0].close()  # a caller leaves router-a: the router lets it go, the sum follows
        await wait_until(lambda: held(watch) == 2, timeout=WAIT)
        # The hostile ones were asked again and again (backoff), logged once each.
        await wait_until(lambda: all(h.asked >= 3 for h in hostiles[:2]), timeout=WAIT)
        for name in ("hostile-garbage", "hostile-huge", "router-down"):
            said = [r for r in caplog.records if f"router {name} " in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.WARNING, name
        assert hostiles[2].asked >= 1  # the slow one holds only its own poll
        leading.clear()  # the Lease lost: no poll, nothing held counted
        await wait_until(lambda: watch.routers() == () and watch.waiting() == {}, timeout=WAIT)
        for c in first[1:] + second:
            c.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for h in hostiles:
            h.released.set()
            if h.runner is not None:
                await h.runner.cleanup()


async def test_a_router_that_comes_back_is_heard_again(
        routers: list[RunningRouter]) -> None:
    (port,) = free_ports(1)
    target = RouterPod("router-late", "127.0.0.1", port)

    async def find() -> tuple[RouterPod, ...]:
        return (target,)

    watch = WakeWatch(find, lambda: None, wait_s=5)
    async with watch.session():
        await watch.retarget((target,))
        late = await start_router(replace(CONFIG, admin_port=port),
                                  _asleep_cluster(), lambda line: None)
        try:
            callers = await hold(late, 1)
            await wait_until(lambda: held(watch) == 1, timeout=WAIT)
            callers[0].close()
            await wait_until(lambda: held(watch) == 0, timeout=WAIT)
        finally:
            await watch.retarget(())
            await late.stop()


def _asleep_cluster() -> Cluster:
    cluster = Cluster()
    cluster.model(chat({"idle": {"state": "Asleep"}}))
    return cluster


async def test_the_routers_are_found_from_the_router_services_slices() -> None:
    asked: list[str] = []

    class Kube:
        async def get(self, path: str) -> Any:
            asked.append(path)
            return {"items": [{"addressType": "IPv4", "endpoints": [
                {"addresses": ["10.0.0.7"], "conditions": {"ready": True},
                 "targetRef": {"kind": "Pod", "name": "router-x"}}]}]}

    find = slice_finder(Kube(), "localmodel")  # type: ignore[arg-type]
    assert await find() == (RouterPod("router-x", "10.0.0.7"),)
    assert asked == ["/apis/discovery.k8s.io/v1/namespaces/localmodel/endpointslices"
                     "?labelSelector=app.kubernetes.io/component=router"]


async def test_only_a_change_of_what_is_held_asks_for_a_pass(
        routers: list[RunningRouter]) -> None:
    changes = 0

    def changed() -> None:
        nonlocal changes
        changes += 1

    target = pod(routers[0], "router-a")
    watch = WakeWatch(_found(target), changed, wait_s=0.2)
    async with watch.session():
        await watch.retarget((target,))
        callers = await hold(routers[0], 1)
        await wait_until(lambda: held(watch) == 1, timeout=WAIT)
        told, answers = changes, watch.answers
        # The router answers again each time its wait ends, the oldest older each time.
        await wait_until(lambda: watch.answers >= answers + 3, timeout=WAIT)
        assert changes == told
        callers[0].close()
        await wait_until(lambda: held(watch) == 0, timeout=WAIT)
        assert changes == told + 1
        await watch.retarget(())


def _found(*pods: RouterPod) -> Any:
    async def find() -> tuple[RouterPod, ...]:
        return pods

    return find


def test_the_pass_reads_what_the_watch_and_the_closer_keep() -> None:
    """Reconciler.idle_signals: the IdleSignals a pass's idle decisions get."""
    from localmodel.controller.config import OperatorConfig
    from localmodel.controller.operator_metrics import OperatorMetrics
    from localmodel.controller.reconcile import Reconciler
    from localmodel.gateway_contract.waiting_answer import Waiting, WaitingModel

    reconciler = Reconciler(OperatorConfig(), None, OperatorMetrics())  # type: ignore[arg-type]
    signals = reconciler.idle_signals(5.0)
    assert (signals.now, dict(signals.waiting), dict(signals.closes)) == (5.0, {}, {})
    watch = WakeWatch(_found(), lambda: None)
    watch._record(RouterPod("r", "10.0.0.1"), Waiting(1, (WaitingModel("ai/chat", 2, 1, 3.0),)))
    reconciler.wake_watch = watch
    assert reconciler.idle_signals(6.0).waiting == {"ai/chat": WaitingModel("ai/chat", 2, 1, 3.0)}
