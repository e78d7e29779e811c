"""The leader Lease's fence (controller/leader.py `holds`, controller/writer.py
`Kube(fence=...)`): when this replica may write, as a table over a clock; a
write the fence refuses never reaches the server (a local aiohttp server
counts what arrives; the real API server is tests/e2e/test_lease.py's); the
rounds run on a thread other than the loop that starts them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from localmodel.controller.leader import LOST_DEADLINE, LeaderElector, LeaseThread
from localmodel.controller.writer import Kube, NotLeading
from localmodel.kube import Credentials
from tests.harness.clock import Clock

pytestmark = pytest.mark.unit


# (leading, seconds since the last renewal's round began, may write); lease 12 s:
# the renewal deadline is 8 s.
HOLDS = [
    (True, 0.0, True),
    (True, 7.9, True),
    (True, 8.0, False),
    (True, 30.0, False),
    (False, 0.0, False),
    (False, 7.0, False),
]


@pytest.mark.parametrize(("leading", "since", "may"), HOLDS)
def test_may_write_only_while_leading_within_the_renewal_deadline(
        leading: bool, since: float, may: bool) -> None:
    clock = Clock()
    elector = LeaderElector(None, "ns", "lease", "me", lease_seconds=12, clock=clock)
    elector._renewed(clock.now)
    elector._set(leading)
    clock.now += since
    assert elector.holds() is may


def test_a_release_is_not_counted_lost_and_a_missed_deadline_is() -> None:
    lost: list[str] = []
    clock = Clock()
    elector = LeaderElector(None, "ns", "lease", "me", clock=clock, on_lost=lost.append)
    elector._set(True)
    elector._set(False)  # as release() ends
    assert lost == []
    elector._set(True)
    elector._set(False, LOST_DEADLINE)
    assert lost == [LOST_DEADLINE]


@asynccontextmanager
async def counting_server(seen: list[str]) -> AsyncIterator[str]:
    async def any_request(request: web.Request) -> web.Response:
        seen.append(request.method)
        return web.json_response({"kind": "Status"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_request)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_the_fence_refuses_writes_before_sending_and_lets_reads_through() -> None:
    seen: list[str] = []
    holds = [True]

    async def main() -> None:
        async with counting_server(seen) as server, Kube(
                Credentials(server=server), fence=lambda: holds[0]) as kube:
            await kube.request("POST", "/api/v1/namespaces/a/configmaps", {}, kind="ConfigMap")
            holds[0] = False
            await kube.get("/api/v1/namespaces/a/configmaps/x")
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                with pytest.raises(NotLeading, match="does not hold the leader Lease"):
                    await kube.request(method, "/api/v1/namespaces/a/configmaps/x", {})

    asyncio.run(main())
    assert seen == ["POST", "GET"]


def test_the_rounds_run_on_a_thread_of_their_own_and_stop_when_cancelled() -> None:
    threads: list[str] = []

    class Recorder(LeaderElector):
        async def try_once(self) -> bool:
            threads.append(threading.current_thread().name)
            self._renewed(self.clock())
            return True

    @asynccontextmanager
    async def client() -> AsyncIterator[Any]:
        yield object()

    async def main() -> None:
        elector = Recorder(None, "ns", "lease", "me", renew_seconds=0.01)
        lease = LeaseThread(elector, client)
        task = asyncio.create_task(lease.run())
        while len(threads) < 3:
            await asyncio.sleep(0.01)
        assert elector.holds()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        count = len(threads)
        await asyncio.sleep(0.1)
        assert len(threads) == count  # stopped

    asyncio.run(main())
    assert set(threads) == {"lease"}
