"""The operator's supervisor (controller/supervise.py): back-off and failure
counts as tables, then in-process: a task that fails N times is restarted N
times with growing waits and counted; a task that fails while leading gives up
the leadership first; the API server silent too long is the reason to exit."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, cast

import pytest

from localmodel.controller.leader import LeaderElector
from localmodel.controller.supervise import (
    BACKOFF_MAX_SECONDS,
    Job,
    Supervisor,
    backoff,
    failures_after,
    lost_api,
    watch_api,
)
from localmodel.controller.writer import Kube
from localmodel.metrics import Counter, render

pytestmark = pytest.mark.unit

BACKOFF = [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, BACKOFF_MAX_SECONDS),
           (500, BACKOFF_MAX_SECONDS), (0, 1.0)]


@pytest.mark.parametrize(("failures", "wait"), BACKOFF)
def test_backoff_doubles_up_to_its_bound(failures: int, wait: float) -> None:
    assert backoff(failures) == wait


@pytest.mark.parametrize(("failures", "ran", "after"), [
    (0, 0.1, 1), (3, 0.1, 4), (3, 119.0, 4), (3, 120.0, 1), (9, 3600.0, 1)])
def test_a_task_that_ran_long_enough_counts_afresh(failures: int, ran: float,
                                                   after: int) -> None:
    assert failures_after(failures, ran) == after


@pytest.mark.parametrize(("now", "last", "exits"), [
    (100.0, 100.0, False), (400.0, 100.0, False), (400.1, 100.0, True), (1e6, 0.0, True)])
def test_the_api_server_silent_past_the_bound_is_a_reason_to_exit(now: float, last: float,
                                                                  exits: bool) -> None:
    why = lost_api(now, last, bound=300.0)
    assert (why is not None) is exits
    if why:
        assert "API server" in why and "300 s" in why


def restarts_of(counter: Counter, task: str) -> float:
    return counter.values.get((task,), 0.0)


def test_a_task_failing_n_times_is_restarted_n_times_with_back_off_and_counted() -> None:
    counter = Counter("localmodel_operator_task_restarts_total", "restarts", ("task",))
    calls: list[float] = []
    hooks: list[int] = []
    settled = asyncio.Event()

    async def flaky() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) <= 4:
            raise RuntimeError(f"failure {len(calls)}")
        settled.set()
        await asyncio.Event().wait()  # then runs for ever

    async def main() -> None:
        sup = Supervisor(counter, first=0.02, most=1.0)
        task = asyncio.create_task(sup.keep(Job("speed", flaky, lambda: hooks.append(1))))
        await asyncio.wait_for(settled.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(calls) == 5 and len(hooks) == 4
    assert restarts_of(counter, "speed") == 4
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # 0.02, 0.04, 0.08, 0.16 s: each wait at least its back-off (no upper bound:
    # the machine is shared).
    assert all(gap >= 0.02 * 2**i * 0.9 for i, gap in enumerate(gaps)), gaps
    assert 'localmodel_operator_task_restarts_total{task="speed"} 4' in render([counter])


def test_a_task_that_ends_is_restarted_too() -> None:
    counter = Counter("r", "restarts", ("task",))
    runs: list[int] = []

    async def short() -> None:
        runs.append(1)

    async def main() -> None:
        task = asyncio.create_task(Supervisor(counter, first=0.01, most=0.01).keep(
            Job("reconcile", short)))
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert restarts_of(counter, "reconcile") >= 2


def test_a_lease_task_that_fails_while_leading_steps_down_first() -> None:
    changes: list[bool] = []
    lost: list[str] = []

    async def main() -> None:
        elector = LeaderElector(cast(Kube, None), "ns", "lease", "me", on_change=changes.append,
                                on_lost=lost.append)
        elector._renewed(time.monotonic())
        elector._set(True)
        assert elector.leading and elector.holds()

        async def broken() -> None:
            raise ValueError("a Lease the code did not expect")

        counter = Counter("r", "restarts", ("task",))
        task = asyncio.create_task(Supervisor(counter, first=10, most=10).keep(
            Job("leader", broken, elector.step_down)))
        while not restarts_of(counter, "leader"):
            await asyncio.sleep(0.01)
        assert not elector.leading and not elector.holds()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert changes == [True, False]
    assert lost == ["task_failed"]  # counted: localmodel_operator_leases_lost_total


def test_watch_api_returns_why_once_the_api_server_is_silent_too_long() -> None:
    async def main() -> Any:
        loop_now = asyncio.get_running_loop().time
        began = loop_now()
        return await asyncio.wait_for(watch_api(lambda: began - 0.5, bound=0.3, every=0.01), 10)

    why = asyncio.run(main())
    assert "has not answered" in why
