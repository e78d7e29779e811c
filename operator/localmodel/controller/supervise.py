"""Keeping the operator's background tasks running, and the few reasons to stop.

A background task (the Lease, the reconciler, the speed reader) that fails is
restarted after a back-off that doubles per failure in a row (`backoff`: 1 s,
2 s, 4 s ... up to BACKOFF_MAX_SECONDS), counted in
`localmodel_operator_task_restarts_total{task}` and logged with its exception;
a task that then ran for STABLE_SECONDS starts counting its failures afresh
(`failures_after`). A task ending without an exception is restarted the same
way (they are loops: an end is a failure).

The operator exits (non-zero, saying why) only for what a restart cannot fix:
* the API server unreachable for longer than API_LOST_SECONDS (`lost_api`):
  its watches, Lease and writes are all gone, and a fresh start (new
  connections, new credentials from the mounted token) is the one remedy left;
* kopf's operator task ending: the watches that feed every pass are gone.
Losing the Lease to another replica is not one of them: this replica stops
writing at once (the pass under way is aborted) and keeps its caches warm as a
standby, as before. A Lease task that fails gives up the leadership first
(`on_failure`), so a replica never writes without renewing.

The pure parts (`backoff`, `failures_after`, `lost_api`) are tables in
tests/controller/test_supervise.py; the loop is tested in-process with a task that
fails N times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from localmodel.metrics import Counter

log = logging.getLogger("localmodel.supervise")

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
STABLE_SECONDS = 120.0  # a task that ran this long starts its failure count afresh
API_LOST_SECONDS = 300.0  # no answer from the API server this long: exit
API_CHECK_SECONDS = 5.0


def backoff(failures: int, first: float = BACKOFF_FIRST_SECONDS,
            most: float = BACKOFF_MAX_SECONDS) -> float:
    """The wait before restarting a task after `failures` failures in a row (>= 1)."""
    return min(most, first * 2.0 ** min(max(failures, 1) - 1, 30))


def failures_after(failures: int, ran_seconds: float, stable: float = STABLE_SECONDS) -> int:
    """The count of failures in a row once a task that ran `ran_seconds` failed again."""
    return 1 if ran_seconds >= stable else failures + 1


def lost_api(now: float, last_answer: float, bound: float = API_LOST_SECONDS) -> str | None:
    """Why to exit, if the API server last answered at `last_answer` (monotonic)
    longer than `bound` ago; else None."""
    silent = now - last_answer
    if silent > bound:
        return (f"the API server has not answered for {silent:.0f} s (more than "
                f"{bound:.0f} s): exiting so that a fresh start reconnects")
    return None


@dataclass
class Job:
    """A background task: how to start it, and what to do when it failed."""

    name: str
    start: Callable[[], Awaitable[None]]
    on_failure: Callable[[], None] | None = None


class Supervisor:
    """Keeps jobs running: restarts one with back-off whenever it fails or ends, and counts the
    restarts."""

    def __init__(self, restarts: Counter, *, first: float = BACKOFF_FIRST_SECONDS,
                 most: float = BACKOFF_MAX_SECONDS, stable: float = STABLE_SECONDS) -> None:
        self.restarts = restarts
        self.first, self.most, self.stable = first, most, stable

    async def keep(self, job: Job) -> None:
        """Run `job` for ever: restarted with back-off whenever it fails or ends.
        Only a cancellation stops it."""
        failures = 0
        while True:
            began = time.monotonic()
            try:
                await job.start()
                why = "ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of a background task is restarted
                why = f"failed: {type(exc).__name__}: {exc}"
                log.error("%s %s", job.name, why, exc_info=exc)
            failures = failures_after(failures, time.monotonic() - began, self.stable)
            if job.on_failure is not None:
                try:
                    job.on_failure()
                except Exception:
                    log.exception("%s: its failure hook failed", job.name)
            wait = backoff(failures, self.first, self.most)
            self.restarts.inc(labels=(job.name,))
            log.warning("%s %s; restarting in %.1f s (failure %d in a row)", job.name,
                        why.split(":", 1)[0], wait, failures)
            await asyncio.sleep(wait)


async def watch_api(last_answer: Callable[[], float], bound: float = API_LOST_SECONDS,
                    every: float = API_CHECK_SECONDS) -> str:
    """Return (the reason) once the API server has been silent longer than `bound`."""
    while True:
        why = lost_api(time.monotonic(), last_answer(), bound)
        if why is not None:
            return why
        await asyncio.sleep(every)
