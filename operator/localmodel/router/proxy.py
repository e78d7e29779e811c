"""One request relayed to one replica's gateway, the answer passed back
byte for byte as it arrives (router/upstream.py: the replica's own framing
goes to the caller unchanged; nothing is held back but a copy of the last
`account.TAIL_BYTES` of data, to read the answer's accounting).

Cancellation: the router serves with aiohttp's handler cancellation on, so a
caller who leaves cancels the handler at once, while it waits for the
replica's first byte or in the middle of a stream; every early end closes the
connection to the replica, and the replica's gateway sees its caller gone at
once and stops its engine (docs/gateway.md, Cancellation). The whole exchange
is bounded by --deadline.

Headers: the caller's Authorization and every `X-LocalModel-*` header, with
X-Priority, X-Request-Timeout and X-Request-Id, pass through unchanged. The
gateway is the one place that checks keys (it holds the keys file and
reloads it) and that knows its queue, priorities and sessions; checking them
here too would be a second copy of each rule that could drift. The answer's
X-Request-Id, X-LocalModel-Served-By and content headers come back; the
replica's other X-LocalModel-* headers do not (the router adds its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from aiohttp import web

from localmodel.gateway_contract.headers import (
    ASLEEP,
    ASLEEP_VALUE,
    OWNED_SESSION_HEADER,
    ROUTE_HEADER,
    SERVED_BY_HEADER,
    WOKE_HEADER,
    WOKE_MARK_HEADER,
)
from localmodel.gateway_contract.headers import PREFIX as HEADER_PREFIX
from localmodel.gateway_contract.marks import MARK_HEADER
from localmodel.gateway_contract.replies import error_response
from localmodel.router.account import Tail
from localmodel.router.upstream import (
    CHUNKED,
    EMPTY,
    LENGTH,
    Address,
    Connection,
    Head,
    Pool,
    UpstreamError,
)

PASS_HEADERS = ("authorization", "content-type", "accept", "x-priority", "x-request-timeout",
                "x-request-id", "user-agent")
BACK_HEADERS = ("content-type", "x-request-id", "cache-control", "retry-after",
                SERVED_BY_HEADER.lower())
PREFIX = HEADER_PREFIX.lower()


def pass_headers(headers: Mapping[str, str],
                 told: Mapping[str, str] | None = None) -> dict[str, str]:
    """What goes on to the replica: the kept headers but the router's own
    (`told`, and the marks', the sessions' and a wake's; a caller's copy of one is dropped,
    whatever its case), `told`,
    and identity encoding (the router reads the answer's tail)."""
    own = {OWNED_SESSION_HEADER.lower(), ROUTE_HEADER.lower(), MARK_HEADER.lower(),
           WOKE_HEADER.lower(), WOKE_MARK_HEADER.lower(), *(k.lower() for k in told or {})}
    out = {k: v for k, v in headers.items() if k.lower() not in own
           and (k.lower() in PASS_HEADERS or k.lower().startswith(PREFIX))}
    out.update(told or {})
    out["Accept-Encoding"] = "identity"
    return out


def back_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """What of the replica's answer head goes on to the caller. Of the
    project's own headers only those a gateway answers with: the router's
    (X-LocalModel-Route, X-LocalModel-Replica) are its own to say, and any
    other a replica sends in that namespace is dropped."""
    return {k: v for k, v in headers if k.lower() in BACK_HEADERS}


def request_bytes(address: Address, path: str, headers: Mapping[str, str],
                  data: bytes, told: Mapping[str, str] | None = None) -> bytes:
    """The POST to the replica, head and body, as one write. A header that
    could split the head (a CR, LF or NUL in it) is left out; aiohttp's
    parser refuses such a header before the router sees it anyway."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {address.authority}",
             f"Content-Length: {len(data)}"]
    for name, value in pass_headers(headers, told).items():
        if not any(c in name or c in value for c in "\r\n\0"):
            lines.append(f"{name}: {value}")
    lines += ("", "")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape") + data


class PassedResponse(web.StreamResponse):
    """A response whose body aiohttp writes as it is given: the replica's own
    framing (chunks or a length) passes through, and `CallerSink` frames what
    needs it. `_length_check` is aiohttp's own switch for this (its
    WebSocketResponse turns it off); tests/router/test_router_relay.py
    compares the bytes a caller reads, so it fails loudly if aiohttp ever
    frames the body a second time.

    Its head waits for the first body write, as the gateway's RelayResponse
    does (`_send_headers_immediately`, aiohttp 3.9+): what the replica sent
    with its own head goes with the caller's head in one write, and
    `relay` writes the head at once when nothing came with it."""

    _length_check = False
    _send_headers_immediately = False


RAW, CHUNK, PLAIN = "raw", "chunk", "plain"


class CallerSink:
    """The caller's side of `Connection.attach`: each run of the replica's
    bytes goes to the caller's socket at once (RAW: as they came; CHUNK:
    made a chunk, for an answer that ends with its connection; PLAIN: the
    data alone, for an HTTP/1.0 caller, whose connection then ends the
    answer), and the data's last bytes go to the tail. Until `first` is
    taken, the bytes are kept instead, to leave with the caller's head."""

    def __init__(self, transport: asyncio.Transport, tail: Tail, mode: str) -> None:
        self.transport = transport
        self.tail = tail
        self.mode = mode
        self.high = transport.get_write_buffer_limits()[1]
        self._first: bytearray | None = bytearray()

    def take_first(self) -> bytes:
        """What came with the replica's head; from now on bytes go out at once."""
        first, self._first = self._first, None
        return bytes(first or b"")

    def data(self, chunk: bytes) -> None:
        self.tail.add(chunk)
        if self.mode == PLAIN:
            self._out(chunk)

    def write(self, raw: bytes) -> bool:
        if self.mode == RAW:
            self._out(raw)
        elif self.mode == CHUNK:
            self._out(b"%x\r\n%b\r\n" % (len(raw), raw))
        return not self.transport.is_closing() and \
            self.transport.get_write_buffer_size() <= self.high

    def _out(self, data: bytes) -> None:
        if self._first is None:
            self.transport.write(data)
        else:
            self._first += data


def _caller_framing(head: Head, http11: bool) -> tuple[str, dict[str, str]]:
    """How the body goes to the caller, and the header that says so."""
    if head.framing == LENGTH:
        return RAW, {"Content-Length": str(head.length)}
    if head.framing == EMPTY:
        return RAW, {"Content-Length": "0"}
    if not http11:
        return PLAIN, {}
    return (RAW if head.framing == CHUNKED else CHUNK), {"Transfer-Encoding": "chunked"}


@dataclass
class Relayed:
    """One answer relayed to the caller: its status, tail, and whether it was complete."""

    response: web.StreamResponse
    status: int
    tail: Tail
    complete: bool  # the whole answer reached the caller
    error: str = ""  # why not, when the router knows
    asleep: bool = False  # the replica's gateway is closed for sleep: nothing went to the caller


def asleep(head: Head) -> bool:
    """Whether a replica's answer says its gateway is closed for sleep (503 and
    X-LocalModel-Asleep: 1): the request never reached its engine."""
    return head.status == 503 and any(
        k.lower() == ASLEEP.lower() and v.strip() == ASLEEP_VALUE for k, v in head.headers)


async def _exchange(pool: Pool, address: Address, message: Callable[[], bytes],
                    sent: Callable[[], None] | None = None) -> tuple[Connection, Head]:
    """Send and read the answer's head; once more on a new connection if a
    kept one was closed by the replica before it answered anything (its idle
    timeout raced our request: the request was not read). The request's
    bytes are made for each send and not kept: a place waiting for its
    answer holds the body once (the caller's bytes), not a second copy."""
    for attempt in (1, 2):
        conn = await (pool.connect(address) if attempt == 1 else pool.open(address))
        conn.send(message())
        if sent is not None and attempt == 1:
            sent()
        try:
            return conn, await conn.head()
        except UpstreamError:
            conn.close()
            if attempt == 2 or not conn.reused or conn.answered:
                raise
        except BaseException:
            conn.close()
            raise
    raise AssertionError("unreachable")


async def relay(
    pool: Pool,
    request: web.Request,
    url: str,
    data: bytes,
    extra: Mapping[str, str],
    deadline: float,
    openai: bool,
    told: Mapping[str, str] | None = None,
    answered: Callable[[int], None] | None = None,
    sent: Callable[[], None] | None = None,
    hold_asleep: bool = False,
) -> Relayed:
    """POST `data` to `url` + the request's path and pass the answer on; `extra` headers
    go on the answer, `told` ones to the replica; `answered` gets the replica's status,
    `sent` is called once the request's bytes went out. With `hold_asleep`, a
    replica's asleep answer (`asleep`) goes nowhere: `Relayed.asleep`, for the
    router to hold the request (router/holding.py)."""
    tail = Tail()
    at = asyncio.get_running_loop().time() + deadline
    address = pool.address(url)
    message = functools.partial(request_bytes, address, request.path, request.headers, data, told)
    try:
        async with asyncio.timeout_at(at):
            conn, head = await _exchange(pool, address, message, sent)
    except (UpstreamError, TimeoutError) as exc:
        return _unanswered(exc, f"{url}{request.path}", extra, openai, tail)
    if hold_asleep and asleep(head):
        conn.close()  # its short body is not read: the connection goes
        return Relayed(web.Response(status=503), 503, tail, False, "asleep", asleep=True)
    if answered is not None:
        answered(head.status)
    mode, framing = _caller_framing(head, request.version >= (1, 1))
    out = PassedResponse(status=head.status,
                         headers={**back_headers(head.headers), **extra, **framing})
    if mode == PLAIN:
        out.force_close()
    complete = False
    try:
        async with asyncio.timeout_at(at):
            await _pass_on(request, out, conn, tail, mode)
        complete = True
        return Relayed(out, head.status, tail, True)
    except TimeoutError:
        return _broken(request, out, head.status, tail, "deadline")
    except UpstreamError as exc:  # the replica broke its answer
        return _broken(request, out, head.status, tail, exc.reason)
    except OSError:  # the caller's connection broke
        return _broken(request, out, head.status, tail, "caller")
    finally:
        if complete:
            pool.release(conn)
        else:
            conn.close()  # the gateway sees its caller gone now


async def _pass_on(
    request: web.Request, out: PassedResponse, conn: Connection, tail: Tail, mode: str
) -> None:
    """The replica's answer to the caller, as it arrives: the head, then the
    body at the pace the caller reads it, then the end."""
    writer = await out.prepare(request)
    assert writer is not None and request.transport is not None
    sink = CallerSink(request.transport, tail, mode)
    conn.attach(sink)
    # The caller's head now, with what came with the replica's.
    await out.write(sink.take_first())
    while True:
        await conn.wait()
        if conn.done:
            break
        await writer.drain()  # the caller's socket was full, or is closing
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("the caller's connection is closing")
        conn.resume()
    await out.write_eof(b"0\r\n\r\n" if mode == CHUNK else b"")


def _unanswered(exc: Exception, where: str, extra: Mapping[str, str], openai: bool,
                tail: Tail) -> Relayed:
    why = str(exc) if isinstance(exc, UpstreamError) else "TimeoutError"
    return Relayed(error_response(502, f"replica {where} did not answer: {why}", dict(extra),
                                  openai=openai), 502, tail, False, "connect")


def _broken(request: web.Request, out: web.StreamResponse, status: int, tail: Tail,
            why: str) -> Relayed:
    """The answer cannot be finished: the caller's connection is closed so it
    sees a cut answer, never a complete-looking one."""
    out.force_close()
    if request.transport is not None:
        with contextlib.suppress(OSError, RuntimeError):
            request.transport.close()
    return Relayed(out, status, tail, False, why)
