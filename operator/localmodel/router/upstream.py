"""The router's HTTP/1.1 connections to replicas' gateways, kept alive and
reused, and an answer's bytes passed to the caller as they arrive.

Why not aiohttp's client for the relay (issue 32, the router's own cost):
per token, aiohttp parses the replica's chunked body into a stream, wakes the
handler's task to read it, and the server encodes it into chunks again. Here
the replica's bytes are written to the caller's socket from this protocol's
`data_received`, once `ChunkedBody` has followed their framing (where the
answer ends, and which bytes are data for the accounting tail): one read and
one write per token, no task between them. The request goes out as one write
of bytes built here. The replicas' /slots and /speed are still read with
aiohttp's client (router/replicas.py): they are not on any caller's path.

What this client speaks is what the router needs of a gateway: one POST at a
time per connection; answers framed by chunks, by Content-Length, or by the
connection's end; no 1xx (the router sends no Expect), no upgrades. Every
bound is checked: the answer's head within HEAD_LIMIT, its framing by
`ChunkedBody`. A connection is reused only after a whole answer that did not
ask to close it, and kept idle at most IDLE_SECONDS (the gateway keeps its
callers' idle connections longer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from localmodel.router.chunked import BadFraming, ChunkedBody

HEAD_LIMIT = 64 * 1024  # an answer's status line and headers
IDLE_SECONDS = 15.0  # an idle connection older than this is closed, not reused
IDLE_PER_REPLICA = 64  # idle connections kept per replica; more are closed

CHUNKED, LENGTH, CLOSE, EMPTY = "chunked", "length", "close", "empty"


FRAMING = "framing"


class UpstreamError(Exception):
    """The exchange with the replica failed; `reason` is the metrics label:
    `connect` (no answer's head: refused, closed, bad head), `stream` (the
    answer broke after its head) or `framing` (its chunked body broke the
    rules: the caller's answer is cut before the bad bytes)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Head:
    """A replica's answer head: status, headers, framing and whether the connection is kept."""

    status: int
    headers: list[tuple[str, str]]
    framing: str  # CHUNKED, LENGTH, CLOSE or EMPTY
    length: int  # for LENGTH
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
    """An answer's status line and headers (without the blank line)."""
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if (len(status_line) < 2 or status_line[0] not in ("HTTP/1.1", "HTTP/1.0")
            or len(status_line[1]) != 3 or not status_line[1].isdigit()):
        raise UpstreamError("connect", f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    status = int(status_line[1])
    headers: list[tuple[str, str]] = []
    chunked, length, close = False, -1, status_line[0] == "HTTP/1.0"
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise UpstreamError("connect", f"not a header line: {line[:60]!r}")
        value = value.strip(" \t")
        headers.append((name, value))
        key = name.lower()
        if key == "transfer-encoding":
            chunked = value.lower().replace(" ", "").split(",")[-1] == "chunked"
            if not chunked:
                raise UpstreamError("connect", f"transfer-encoding {value!r} is not chunked")
        elif key == "content-length":
            if not value.isdigit() or len(value) > 18 or (length >= 0 and int(value) != length):
                raise UpstreamError("connect", f"a bad content-length: {value[:40]!r}")
            length = int(value)
        elif key == "connection":
            tokens = {t.strip().lower() for t in value.split(",")}
            close = "close" in tokens or (close and "keep-alive" not in tokens)
    if status < 200:
        raise UpstreamError("connect", f"an unexpected {status} answer")
    if status in (204, 304):
        return Head(status, headers, EMPTY, 0, not close)
    if chunked:
        return Head(status, headers, CHUNKED, 0, not close)
    if length >= 0:
        return Head(status, headers, LENGTH if length else EMPTY, length, not close)
    return Head(status, headers, CLOSE, 0, False)


class Sink(Protocol):
    """Where an answer's body goes: `write` gets the bytes to pass on as
    they arrive, `data` the data bytes among them (for the accounting tail).
    `write` returns False when the caller's socket is full: reading stops
    until `Connection.resume`."""

    def write(self, raw: bytes) -> bool: ...

    def data(self, chunk: bytes) -> None: ...


@dataclass(frozen=True)
class Address:
    """A replica's address: scheme, host, port and the Host header."""

    scheme: str
    host: str
    port: int
    authority: str  # the Host header


def address_of(url: str) -> Address:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Address(parts.scheme, parts.hostname, port, parts.netloc)


class Connection(asyncio.Protocol):
    """One connection to a replica, one exchange at a time."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reused = False  # it served an exchange before this one
        self.answered = False  # a byte of this exchange's answer arrived
        self.closed = False
        self._head_buf = bytearray()
        self._head: asyncio.Future[Head] | None = None
        self._pending: list[bytes] = []  # body bytes that came before the sink
        self._sink: Sink | None = None
        self._framing = EMPTY
        self._left = 0  # LENGTH: body bytes still to come
        self._chunked: ChunkedBody | None = None
        self._held = b""  # the bytes of a chunk line not yet complete
        self._keep_alive = False
        self._wake: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self.done = False  # the whole answer was followed
        self.paused = False  # the caller's socket is full

    # ---- asyncio.Protocol -------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._framing == CLOSE and self._head is not None and self._head.done():
            self._finish()  # the connection's end is the answer's end
            return
        self._fail(UpstreamError(
            "connect" if self._head is not None and not self._head.done() else "stream",
            f"the replica closed the connection{f': {exc}' if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        if self._head is None or self.done or self._error is not None:
            self._abort()  # bytes nobody asked for: the connection is not reusable
            return
        self.answered = True
        if not self._head.done():
            self._head_buf += data
            end = self._head_buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head_buf) > HEAD_LIMIT:
                    self._fail(UpstreamError("connect", "the answer's head is too long"))
                return
            if end > HEAD_LIMIT:
                self._fail(UpstreamError("connect", "the answer's head is too long"))
                return
            try:
                head = parse_head(bytes(self._head_buf[:end]))
            except UpstreamError as exc:
                self._fail(exc)
                return
            rest = bytes(self._head_buf[end + 4:])
            self._head_buf.clear()
            self._start_body(head)
            self._head.set_result(head)
            if self.done:
                self._keep_alive = self._keep_alive and not rest
                return
            assert self.transport is not None
            self.transport.pause_reading()  # until the caller's answer is prepared
            if rest:
                self._pending.append(rest)
            return
        if self._sink is None:
            self._pending.append(data)
            return
        self._body(data)

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    # ---- one exchange ---------------------------------------------------------

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(request)

    async def head(self) -> Head:
        assert self._head is not None
        return await self._head

    def attach(self, sink: Sink) -> None:
        """Pass the body to `sink` from now on (what came before it first)."""
        self._sink = sink
        pending, self._pending = self._pending, []
        for data in pending:
            self._body(data)
        if not self.done and self._error is None and not self.paused:
            assert self.transport is not None
            self.transport.resume_reading()

    async def wait(self) -> None:
        """Until the answer is done, failed (raised), or the caller's socket is full."""
        while not self.done and not self.paused:
            if self._error is not None:
                raise self._error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        if self._error is not None:
            raise self._error

    def resume(self) -> None:
        self.paused = False
        if not self.done and self._error is None and self.transport is not None:
            self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        return self.done and self._keep_alive and not self.closed and self._error is None

    def reset(self) -> None:
        """Ready for the next exchange (after a reusable one)."""
        self._head = None
        self.answered = False
        self._sink = None
        self._chunked = None
        self._held = b""
        self.done = False
        self.paused = False
        self._wake = None
        if self.transport is not None:
            # Reading was paused at the head if the whole answer came with it.
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ---- the body ---------------------------------------------------------------

    def _start_body(self, head: Head) -> None:
        self._framing = head.framing
        self._keep_alive = head.keep_alive
        if head.framing == CHUNKED:
            self._chunked = ChunkedBody()
        elif head.framing == LENGTH:
            self._left = head.length
        elif head.framing == EMPTY:
            self.done = True

    def _body(self, data: bytes) -> None:
        sink = self._sink
        assert sink is not None
        try:
            if self._chunked is not None:
                data = self._checked(self._chunked, data, sink)
            elif self._framing == LENGTH:
                if len(data) >= self._left:
                    self._keep_alive = self._keep_alive and len(data) == self._left
                    data = data[:self._left]
                    self.done = True
                self._left -= len(data)
                sink.data(data)
            else:
                sink.data(data)
        except BadFraming as exc:
            self._fail(UpstreamError(FRAMING, f"the replica's chunked body broke: {exc}"))
            return
        if data and not sink.write(data) and not self.done:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        if self.done or self.paused:
            self._wakeup()

    def _checked(self, chunked: ChunkedBody, data: bytes, sink: Sink) -> bytes:
        """The bytes of `data` (after those held back) that may go on: all but
        a line not yet complete, which waits to be checked whole."""
        held, self._held = self._held, b""
        used = chunked.feed(data, sink.data)
        if chunked.done:
            self.done = True
            self._keep_alive = self._keep_alive and used == len(data)
        out = held + data[:used] if held else data[:used]
        if chunked.pending:
            out, self._held = out[:-chunked.pending], out[-chunked.pending:]
        return out

    def _finish(self) -> None:
        if self._error is not None:
            return
        self.done = True
        self._keep_alive = False
        self._wakeup()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.done:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved here: the waiter may be gone
        self._wakeup()
        self._abort()

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


class Pool:
    """Idle connections per replica, reused newest first."""

    def __init__(self, connect_timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.connect_timeout = connect_timeout
        self._clock = clock
        self._idle: dict[Address, list[Connection]] = {}
        self._addresses: dict[str, Address] = {}
        self._ssl: ssl.SSLContext | None = None

    def address(self, url: str) -> Address:
        found = self._addresses.get(url)
        if found is None:
            found = self._addresses[url] = address_of(url)
        return found

    async def connect(self, address: Address) -> Connection:
        """A connection to `address`: an idle one if there is one, else a new one."""
        idle = self._idle.get(address)
        now = self._clock()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_SECONDS:
                conn.reused = True
                return conn
            conn.close()
        return await self.open(address)

    async def open(self, address: Address) -> Connection:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if address.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(address), address.host, address.port, ssl=context)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError("connect", f"{type(exc).__name__}: {exc}") from None
        return conn

    def release(self, conn: Connection) -> None:
        """Keep `conn` for reuse if its exchange ended cleanly, else close it."""
        if not conn.reusable:
            conn.close()
            return
        conn.reset()
        conn.idle_since = self._clock()
        idle = self._idle.setdefault(conn.address, [])
        idle.append(conn)
        while len(idle) > IDLE_PER_REPLICA:
            idle.pop(0).close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
