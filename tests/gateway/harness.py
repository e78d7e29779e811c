"""Helpers for the gateway tests: a gateway in front of the Ollama stand-in
(tests/gateway/ollama_standin.py, a stand-in, not Ollama), a bare-socket HTTP
client that decides when a caller disconnects, and polling."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from localmodel.gateway.server import RunningGateway, start_gateway
from localmodel.gateway.slots import SlotBoard
from localmodel.gateway_contract import GatewayConfig
from tests.gateway.ollama_standin import StandinOllama

BASE = GatewayConfig(
    listen_host="127.0.0.1",
    listen_port=0,
    model="standin:1b",
    threads=2,
    context=4096,
    max_tokens=4096,
    # Calibration at readiness has its own tests (test_gateway_standin.py,
    # Speed): the others count the stand-in's requests and want /readyz at once.
    calibrate_tokens=0,
)


@dataclass
class Rig:
    gateway: RunningGateway
    standin: StandinOllama
    standin_url: str
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def admin_url(self) -> str:
        """The admin port: /metrics, /speed, /ledger."""
        return self.gateway.admin_url

    def log_docs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log]


RigFactory = Callable[..., Awaitable[Rig]]
# make(**config overrides) -> (the gateway, its access-log lines)
GatewayFactory = Callable[..., Awaitable[tuple[RunningGateway, list[str]]]]


class Gateways:
    """The gateways a test's factory fixture started, each with the access-log
    lines it wrote (unless another writer was given); `stop` stops them all,
    the last started first."""

    def __init__(self) -> None:
        self.started: list[RunningGateway] = []

    async def start(
        self, config: GatewayConfig, access_log: Callable[[str], None] | None = None
    ) -> tuple[RunningGateway, list[str]]:
        log: list[str] = []
        running = await start_gateway(config, access_log or log.append)
        self.started.append(running)
        return running, log

    async def stop(self) -> None:
        while self.started:
            await self.started.pop().stop()


async def wait_until(check: Callable[[], bool], timeout: float = 5.0, step: float = 0.001) -> float:
    """Poll until check() is true; returns the monotonic time it became true."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)
    return time.monotonic()


def books_reach(board: SlotBoard, n: int) -> bool:
    """True once n requests hold or wait for a slot."""
    snap = board.snapshot()
    return snap.busy + snap.queued == n


class RawClient:
    """An HTTP/1.1 client on a bare socket, so a test decides exactly when the
    connection closes (the way a caller that times out or dies does)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def send(
        cls,
        port: int,
        path: str,
        body: bytes | dict[str, Any],
        headers: dict[str, str] | None = None,
        method: str = "POST",
    ) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [
            f"{method} {path} HTTP/1.1",
            "Host: 127.0.0.1",
            f"Content-Length: {len(raw)}",
            "Content-Type: application/json",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
        await writer.drain()
        return cls(reader, writer)

    def close(self) -> None:
        self.writer.close()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        else:
            body = await self._chunked()
        return status, headers, body

    async def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            size = int((await self.reader.readline()).strip() or b"0", 16)
            if size == 0:
                await self.reader.readline()
                return bytes(out)
            out += await self.reader.readexactly(size)
            await self.reader.readline()
