"""How long the running event loop was held from its other tasks: a watch that
wakes every `period` seconds and keeps the worst lateness it saw."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass
class LoopStall:
    worst: float = 0.0  # seconds a wake-up came late, at most


@asynccontextmanager
async def loop_stall_watch(period: float = 0.01) -> AsyncIterator[LoopStall]:
    """Watch the running loop for the duration of the `async with` block."""
    stall = LoopStall()

    async def watch() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(period)
            stall.worst = max(stall.worst, time.monotonic() - before - period)

    task = asyncio.create_task(watch())
    try:
        yield stall
    finally:
        task.cancel()
