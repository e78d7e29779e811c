"""The gateway's two connections, at the byte level: what it tells the caller
(JSON answers, errors inside a stream already begun) and how it reads the
upstream (the engine or the overflow endpoint) through one client session.

Every read of an upstream body goes through `read_chunk` and every write to a
caller through `to_caller`, so a failure is always told apart by side: the
upstream broke its stream (`UpstreamBroke`) or the caller left (`CallerGone`).
"""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web
from yarl import URL

from localmodel.gateway.routes import Route
from localmodel.gateway_contract.replies import openai_error


def stream_error(route: Route, message: str) -> bytes:
    """An error told inside a stream the caller is already reading."""
    if route.is_openai:
        return b"data: " + json.dumps(openai_error(message)).encode() + b"\n\n"
    return json.dumps({"error": message}).encode() + b"\n"


class RelayResponse(web.StreamResponse):
    """A streamed response whose headers wait for the first body write, as
    aiohttp's own `web.Response` does: when the engine's headers arrive with
    its first chunk (the usual case), both go to the caller in one write
    instead of two, one syscall and one TCP segment less per response (see
    docs/gateway.md, Overhead benchmark). `BodyRelay.stream` writes at once when
    no chunk is there yet, so a caller still sees the status as soon as the engine
    sent its own.

    `_send_headers_immediately` is private to aiohttp (3.9+, where
    `web.Response` sets it False). tests/gateway/test_gateway_standin.py fails
    loudly if aiohttp drops it; without it headers simply go at `prepare`."""

    _send_headers_immediately = False


class CallerGone(Exception):
    """Writing to the caller failed: it went away."""


class UpstreamBroke(Exception):
    """Reading the upstream's stream failed mid-way."""


async def read_chunk(upstream: aiohttp.ClientResponse, *, wait: bool = True) -> bytes:
    """The one read of an upstream body (wait=False: only what already arrived).
    A failure here is the upstream's."""
    try:
        if wait:
            return await upstream.content.readany()
        return upstream.content.read_nowait()
    except aiohttp.ClientError as exc:
        raise UpstreamBroke(f"upstream stream broke: {exc!r}") from exc


async def read_limited(upstream: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    while len(body) < limit and (chunk := await read_chunk(upstream)):
        body += chunk
    return bytes(body[:limit])


async def to_caller(
    response: web.StreamResponse, chunk: bytes = b"", *, eof: bool = False
) -> None:
    """The one write to the caller (eof: with the end of the body). A failure
    here means the caller left."""
    try:
        if eof:
            await response.write_eof(chunk)
        else:
            await response.write(chunk)
    except ConnectionError as exc:
        raise CallerGone from exc


class Upstreams:
    """The one client session every upstream call uses (opened when the app
    starts, closed when it stops) and the URLs it calls, parsed once each."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}

    def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # The engine sets no cookies, and one jar shared by every caller
            # must not carry any from one caller to the next (it also saves
            # a jar lookup per request).
            cookie_jar=aiohttp.DummyCookieJar(),
            # Connect fast or fail fast: the engine is on loopback. Reads are
            # bounded by each request's deadline instead (prefill can be long).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=3.0, connect=5.0),
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "gateway not started"
        return self._session

    def url(self, base: str, path: str) -> URL:
        key = base + path
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(key)
        return url
