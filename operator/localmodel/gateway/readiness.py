"""/readyz: ready once the engine answers and, for Ollama, the model is loaded.

The answer is kept for a second, so a probe storm costs the engine one call.
While Ollama has not loaded the model, the gateway loads it once with the
owned settings (the warm-up), so the first caller does not pay for the load
and the load uses the right thread count.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from localmodel.engines import llama_server, ollama
from localmodel.gateway.config import GatewayConfig
from localmodel.gateway.rewrite import load_request, model_loaded
from localmodel.gateway.wire import Upstreams, json_response

READY_CACHE_SECONDS = 1.0
_SERVING = object()  # the engine serves its model (llama-server: one model, loaded)


@dataclass
class _Ready:
    at: float = -1e9
    ok: bool = False
    reason: str = "not checked yet"


class Readiness:
    def __init__(
        self, config: GatewayConfig, upstreams: Upstreams, clock: Callable[[], float]
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self._clock = clock
        self._ready = _Ready()
        self._warmup: asyncio.Task[None] | None = None

    async def handle_readyz(self, request: web.Request) -> web.Response:
        now = self._clock()
        if now - self._ready.at >= READY_CACHE_SECONDS:
            ok, reason = await self._check_engine()
            self._ready = _Ready(at=self._clock(), ok=ok, reason=reason)
        if self._ready.ok:
            return json_response(200, {"ready": True})
        return json_response(503, {"ready": False, "reason": self._ready.reason})

    async def stop(self) -> None:
        """Cancel a warm-up still running."""
        if self._warmup is not None:
            self._warmup.cancel()
            with contextlib.suppress(BaseException):
                await self._warmup

    async def _check_engine(self) -> tuple[bool, str]:
        try:
            loaded = await self._ask_engine()
        except _NotReady as exc:
            return False, str(exc)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"engine unreachable at {self.config.upstream}: {exc!r}"
        if loaded is _SERVING or not self.config.model or model_loaded(self.config.model, loaded):
            return True, ""
        self._start_warmup()
        return False, f"model {self.config.model} not loaded yet (loading)"

    async def _ask_engine(self) -> Any:
        """Ollama's list of loaded models; _SERVING from llama-server, which
        answers its health path only once its one model is loaded."""
        session = self.upstreams.session
        async with asyncio.timeout(2.0):
            if self.config.engine == llama_server.NAME:
                # Its health path answers 503 while the model loads, 200 once loaded.
                path = llama_server.HEALTH_PATH
                async with session.get(self._url(path)) as resp:
                    _answered_ok(resp, path)
                return _SERVING
            async with session.get(self._url(ollama.PS_PATH)) as resp:
                _answered_ok(resp, ollama.PS_PATH)
                return await resp.json(content_type=None)

    def _start_warmup(self) -> None:
        """Load the model with the owned settings, once at a time."""
        if self._warmup is not None and not self._warmup.done():
            return
        self._warmup = asyncio.get_running_loop().create_task(self._load_model())

    async def _load_model(self) -> None:
        body = load_request(self.config)
        url = self._url(ollama.GENERATE_PATH)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self.upstreams.session.post(url, json=body) as resp:
                await resp.read()

    def _url(self, path: str) -> URL:
        return self.upstreams.url(self.config.upstream, path)


class _NotReady(Exception):
    """The engine answered, not ready yet."""


def _answered_ok(resp: aiohttp.ClientResponse, path: str) -> None:
    if resp.status != 200:
        raise _NotReady(f"engine {path} answered {resp.status}")
