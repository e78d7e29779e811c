"""A STAND-IN for a hosted OpenAI-compatible endpoint, as the gateway's overflow.

This is not OpenAI. It is a small aiohttp server on loopback that speaks the
parts of the chat/completions API the gateway's overflow uses, and like a
hosted endpoint it refuses a request without its API key (401). It records
what it was sent (headers and body) and how each request ended, and it can be
told to fail (a status), to hang (accept, never answer) or to stream slowly,
which a real provider cannot be made to do on demand. The engine-tier tests
use a second real llama-server started with --api-key as the overflow.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    started: float
    ended: float | None = None
    how: str = ""  # done, client_gone, refused, failed, hung


@dataclass
class StandinOpenAI:
    api_key: str
    tokens: int = 5
    token_delay: float = 0.01
    model: str = "overflow-model"
    fail_status: int | None = None
    hang: bool = False
    # What it says instead of far0 far1 ... (one piece an event), and a string
    # split between two writes wherever an event holds it (a pause between:
    # the gateway reads two chunks), as a careless endpoint echoing the key.
    say: list[str] | None = None
    split_on: str | None = None
    calls: list[Call] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        return app

    def _end(self, call: Call, how: str) -> None:
        if call.ended is None:
            call.ended = time.monotonic()
            call.how = how

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        call = Call(request.path, dict(request.headers), body, time.monotonic())
        self.calls.append(call)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._end(call, "refused")
            return web.json_response(
                {"error": {"message": "invalid api key", "type": "invalid_request_error"}},
                status=401,
            )
        if self.fail_status is not None:
            self._end(call, "failed")
            return web.json_response({"error": {"message": "overloaded"}}, status=self.fail_status)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            return await self._answer(request, body, call)
        except asyncio.CancelledError:
            self._end(call, "client_gone")
            raise
        except ConnectionError:
            self._end(call, "client_gone")
            raise

    async def _answer(
        self, request: web.Request, body: dict[str, Any], call: Call
    ) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        obj = "chat.completion" if chat else "text_completion"
        pieces = self.say if self.say is not None else [f"far{i} " for i in range(self.tokens)]
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": len(pieces),
            "total_tokens": 7 + len(pieces),
        }
        base = {"id": "cmpl-overflow", "created": 2, "model": body.get("model", self.model)}
        if not body.get("stream"):
            for _ in pieces:
                await asyncio.sleep(self.token_delay)
            text = "".join(pieces)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self._end(call, "done")
            return web.json_response({**base, "object": obj, "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(choice: dict[str, Any] | None, **extra: Any) -> None:
            doc = {**base, "object": obj + ".chunk" if chat else obj, **extra}
            doc["choices"] = [choice] if choice is not None else []
            data = b"data: " + json.dumps(doc).encode() + b"\n\n"
            at = data.find(self.split_on.encode()) if self.split_on else -1
            if at >= 0:
                middle = at + len(self.split_on or "") // 2
                await response.write(data[:middle])
                await asyncio.sleep(0.02)
                data = data[middle:]
            await response.write(data)

        for piece in pieces:
            await asyncio.sleep(self.token_delay)
            if chat:
                await event({"index": 0, "delta": {"content": piece}, "finish_reason": None})
            else:
                await event({"index": 0, "text": piece, "finish_reason": None})
        last: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        await event(last | ({"delta": {}} if chat else {"text": ""}))
        if (body.get("stream_options") or {}).get("include_usage"):
            await event(None, usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self._end(call, "done")
        return response


async def start_openai_standin(standin: StandinOpenAI) -> tuple[web.AppRunner, str]:
    """Serve on a free loopback port; returns the runner and the base URL (.../v1)."""
    runner = web.AppRunner(standin.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
