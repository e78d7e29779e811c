"""One request relayed to one replica's gateway, the answer streamed back
chunk by chunk as it arrives (nothing is held back but the last
`account.TAIL_BYTES`, copied to read the answer's accounting).

Cancellation: the router serves with aiohttp's handler cancellation on, so a
caller who leaves cancels the handler at once, while it waits for the
replica's first byte or in the middle of a stream; every early end closes the
upstream response (`ClientResponse.close`, which closes its connection), and
the replica's gateway sees its caller gone at once and stops its engine
(docs/gateway.md, Cancellation). The whole exchange is bounded by --deadline.

Headers: the caller's Authorization and every `X-LocalModel-*` header, with
X-Priority, X-Request-Timeout and X-Request-Id, pass through unchanged. The
gateway is the one place that checks keys (it holds the keys file and
reloads it) and that knows its queue, priorities and sessions; checking them
here too would be a second copy of each rule that could drift. The answer's
X-Request-Id, X-LocalModel-* and content headers come back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from localmodel.gateway.wire import error_response
from localmodel.router.account import Tail

PASS_HEADERS = ("authorization", "content-type", "accept", "x-priority", "x-request-timeout",
                "x-request-id", "user-agent")
BACK_HEADERS = ("content-type", "x-request-id", "cache-control", "retry-after")
PREFIX = "x-localmodel-"


def pass_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What goes on to the replica: the kept headers, and identity encoding
    (the router reads the answer's tail)."""
    out = {k: v for k, v in headers.items() if k.lower() in PASS_HEADERS
           or k.lower().startswith(PREFIX)}
    out["Accept-Encoding"] = "identity"
    return out


def back_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in BACK_HEADERS
            or k.lower().startswith(PREFIX)}


@dataclass
class Relayed:
    response: web.StreamResponse
    status: int
    tail: Tail
    complete: bool  # the whole answer reached the caller
    error: str = ""  # why not, when the router knows


async def relay(
    session: aiohttp.ClientSession,
    request: web.Request,
    url: str,
    data: bytes,
    extra: Mapping[str, str],
    deadline: float,
    openai: bool,
) -> Relayed:
    """POST `data` to `url` and stream the answer to the caller; `extra`
    headers go on the answer (the routing decision)."""
    tail = Tail()
    at = asyncio.get_running_loop().time() + deadline
    try:
        async with asyncio.timeout_at(at):
            upstream = await session.post(url, data=data, headers=pass_headers(request.headers))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        message = f"replica {url} did not answer: {type(exc).__name__}"
        return Relayed(error_response(502, message, dict(extra), openai=openai), 502, tail,
                       False, "connect")
    out = web.StreamResponse(status=upstream.status,
                             headers={**back_headers(upstream.headers), **extra})
    complete = False
    try:
        async with asyncio.timeout_at(at):
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                tail.add(chunk)
                await out.write(chunk)
            await out.write_eof()
        complete = True
        return Relayed(out, upstream.status, tail, True)
    except TimeoutError:
        return _broken(request, out, upstream.status, tail, "deadline")
    except (aiohttp.ClientError, OSError) as exc:
        # The replica broke its answer, or the caller's connection broke.
        return _broken(request, out, upstream.status, tail, type(exc).__name__)
    finally:
        if complete:
            upstream.release()
        else:
            upstream.close()  # the gateway sees its caller gone now


def _broken(request: web.Request, out: web.StreamResponse, status: int, tail: Tail,
            why: str) -> Relayed:
    """The answer cannot be finished: the caller's connection is closed so it
    sees a cut answer, never a complete-looking one."""
    out.force_close()
    if request.transport is not None:
        with contextlib.suppress(OSError, RuntimeError):
            request.transport.close()
    return Relayed(out, status, tail, False, why)
