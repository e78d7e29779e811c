"""Fixtures for the gateway tests: the gateway in-process on a free loopback
port, in front of the Ollama stand-in (tests/gateway/ollama_standin.py, a
stand-in, not Ollama). The real llama-server's fixtures are in test_engine.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.gateway.harness import BASE, Gateways, Rig, RigFactory
from tests.gateway.ollama_standin import StandinOllama, start_standin


@pytest.fixture
async def make_rig() -> AsyncIterator[RigFactory]:
    """make_rig(standin=StandinOllama(...), access_log=..., **config_overrides) -> Rig."""
    gateways = Gateways()
    standins: list[Callable[[], Awaitable[None]]] = []

    async def make(
        standin: StandinOllama | None = None,
        access_log: Callable[[str], None] | None = None,
        **overrides: Any,
    ) -> Rig:
        standin = standin or StandinOllama()
        runner, url = await start_standin(standin)
        standins.append(runner.cleanup)
        gateway, log = await gateways.start(replace(BASE, upstream=url, **overrides), access_log)
        return Rig(gateway, standin, url, log)

    yield make
    await gateways.stop()  # each before its stand-in
    for cleanup in reversed(standins):
        await cleanup()
