"""A hostile tenant's "gateway" for tests/realnode/test_router_tenants_on_node.py:
a process-free stand-in, served from the test's own process on the host at the
pod IP kwok gave the hostile tenant's pod (kwok runs no containers).

It plays a gateway image that lists and reports what it likes: its `/slots`
says it is full with a long queue and lists session keys of its choosing
(well-formed ones, so that the router takes the document: keys computed
unsalted from the victim's session names, as a tenant who knows them could,
plus random ones), its `/speed` says a request takes 100 s, and it records
every request it receives (any method and path, on both ports, with its
headers and whether its body held a text it was told to look for), holding
each POST `hold` seconds before it answers 200.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from localmodel.engines import ollama
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT

BODY_LIMIT = 16 * 1024**2  # what it reads of a body (the router's flood bodies are 1 MiB)


@dataclass
class Seen:
    """One request the stand-in received."""

    port: int
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body_bytes: int
    body_head: bytes  # the first 512 bytes
    peer: str
    watched: list[str]  # which of the watched texts the body held


def unsalted_key(session: str) -> str:
    """A session key as a tenant without the router's salt would guess it."""
    return "h:" + hashlib.blake2b(session.encode(), digest_size=12).hexdigest()


def slots_document(keys: list[str]) -> dict[str, Any]:
    """Full, with a long queue, "owning" `keys`."""
    return {"model": "-", "engine": "llama-server", "total": 1, "busy": 1, "free": 0,
            "queued": {"foreground": 500, "background": 0}, "queue_limit": 1000,
            "threads": 1, "context": 1024, "owned_sessions": keys}


def speed_document() -> dict[str, Any]:
    """A request takes 100 s here (10 requests, 1000 s of engine time), and
    prefill crawls."""
    return {"engine": "llama-server", "model": "-", "threads": 1, "calibrating": False,
            "calibration": {"decode_tokens_per_second": 0.01, "prefill_tokens_per_second": 0.01,
                            "generated_tokens": 1, "prompt_tokens": 1, "seconds": 100.0,
                            "complete": True, "at": 1.0, "error": None},
            "recent": {"window_seconds": 60, "requests": 10, "decode_tokens_per_second": 0.01,
                       "prefill_tokens_per_second": 0.01},
            "totals": {"requests": 10, "generated_tokens": 10, "decode_seconds": 500.0,
                       "prompt_tokens": 10, "prefill_seconds": 500.0}}


@dataclass
class HostileGateway:
    """The stand-in at `ip` (added to `lo` by `start`, removed by `stop`)."""

    ip: str
    sessions: list[str]  # the victim's session names: their unsalted keys are listed
    watch: list[str]  # texts whose presence in a body is recorded
    hold: float = 1.0
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _address_added: bool = False

    def keys(self) -> list[str]:
        return [unsalted_key(s) for s in self.sessions] + [
            "h:" + secrets.token_hex(12) for _ in range(8)] + [
            "f:" + secrets.token_hex(12) for _ in range(8)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        peer = request.remote or "-"
        self.seen.append(Seen(port=port, method=request.method, path=request.path,
                              headers={k.lower(): v for k, v in request.headers.items()},
                              body_bytes=len(body),
                              body_head=body[:512], peer=peer,
                              watched=[w for w in self.watch if w.encode() in body]))
        path = request.path
        if path == "/slots":
            return web.json_response(slots_document(self.keys()))
        if path == "/speed":
            return web.json_response(speed_document())
        if path in ("/readyz", "/healthz"):
            return web.json_response({"ok": True})
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": [
                {"id": "gemma3:270m", "object": "model"}, {"id": "everything", "object": "model"}]})
        if path == ollama.TAGS_PATH:
            return web.json_response({"models": [{"name": "gemma3:270m", "model": "gemma3:270m"}]})
        if request.method == "POST":
            await asyncio.sleep(self.hold)
            if path.startswith("/api/"):
                return web.json_response({"model": "x", "done": True, "response": "team-b here",
                                          "message": {"role": "assistant",
                                                      "content": "team-b here"}})
            return web.json_response({
                "id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "x",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "team-b here"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
        return web.json_response({})

    def start(self) -> None:
        subprocess.run(["ip", "addr", "add", f"{self.ip}/32", "dev", "lo"], check=True)
        self._address_added = True
        started = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                app = web.Application(client_max_size=BODY_LIMIT)
                app.router.add_route("*", "/{tail:.*}", self._handle)
                self._runner = web.AppRunner(app, access_log=None)
                loop.run_until_complete(self._runner.setup())
                for port in (GATEWAY_PORT, ADMIN_PORT):
                    loop.run_until_complete(web.TCPSite(self._runner, self.ip, port).start())
            except BaseException as exc:
                errors.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="hostile-gateway", daemon=True)
        self._thread.start()
        started.wait(30)
        if errors:
            self.stop()
            raise errors[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        if self._address_added:
            subprocess.run(["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"], check=False)
            self._address_added = False

    def requests(self) -> list[Seen]:
        """What it received other than the reads of its state (/slots, /speed, probes)."""
        return [s for s in list(self.seen)
                if s.path not in ("/slots", "/speed", "/readyz", "/healthz", "/metrics")]
