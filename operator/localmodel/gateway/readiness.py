"""/readyz: ready once the engine answers and, for Ollama, the model is loaded,
and the replica's speed is calibrated.

The answer is kept for a second, so a probe storm costs the engine one call.
While Ollama has not loaded the model, the gateway loads it once with the
owned settings (the warm-up), so the first caller does not pay for the load
and the load uses the right thread count. Once the model serves, one fixed
generation measures this replica's speed on its own node under its own limit
(gateway/speed.py, Calibration) before the pod reports Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from localmodel.engines import facts, timings
from localmodel.gateway.assemble import StreamWatcher
from localmodel.gateway.rewrite import (
    keep_alive_value,
    load_request,
    model_loaded,
    pod_runner_options,
)
from localmodel.gateway.speed import (
    CALIBRATION_DEADLINE_SECONDS,
    Calibration,
    SpeedRecord,
    calibration_call,
    calibration_from,
)
from localmodel.gateway.stream import LineSplitter
from localmodel.gateway.wire import Upstreams
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.replies import json_response

READY_CACHE_SECONDS = 1.0
_SERVING = object()  # the engine serves its model (llama-server: one model, loaded)


@dataclass
class _Ready:
    """Keeps the last readiness check: when, its answer and why."""

    at: float = -1e9
    ok: bool = False
    reason: str = "not checked yet"


class Readiness:
    """Decides whether the gateway is ready (/readyz): its engine serves the model and it is
    calibrated, the answer kept READY_CACHE_SECONDS; starts the model's load and calibration."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        clock: Callable[[], float],
        speed: SpeedRecord | None = None,
    ) -> None:
        self.config = config
        self.engine = facts(config.engine)
        self.upstreams = upstreams
        self._clock = clock
        self._ready = _Ready()
        self._warmup: asyncio.Task[None] | None = None
        self.speed = speed if speed is not None else SpeedRecord()
        self._calibration: asyncio.Task[None] | None = None

    async def handle_readyz(self, request: web.Request) -> web.Response:
        now = self._clock()
        if now - self._ready.at >= READY_CACHE_SECONDS:
            ok, reason = await self._check_engine()
            self._ready = _Ready(at=self._clock(), ok=ok, reason=reason)
        if self._ready.ok:
            return json_response(200, {"ready": True})
        return json_response(503, {"ready": False, "reason": self._ready.reason})

    async def stop(self) -> None:
        """Cancel a warm-up or calibration still running."""
        for task in (self._warmup, self._calibration):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _check_engine(self) -> tuple[bool, str]:
        try:
            loaded = await self._ask_engine()
        except _NotReady as exc:
            return False, str(exc)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"engine unreachable at {self.config.upstream}: {exc!r}"
        if loaded is _SERVING or not self.config.model or model_loaded(self.config.model, loaded):
            return self._calibrated()
        self._start_warmup()
        return False, f"model {self.config.model} not loaded yet (loading)"

    def _calibrated(self) -> tuple[bool, str]:
        """Ready once calibrated (or calibration is off, or it failed: a pod is
        never held back for want of a measurement)."""
        if self.config.calibrate_tokens == 0 or self.speed.calibration is not None:
            return True, ""
        if self._calibration is None:
            self.speed.calibrating = True
            self._calibration = asyncio.get_running_loop().create_task(self._calibrate())
        return False, "model loaded; calibrating decode speed"

    async def _calibrate(self) -> None:
        c = self.config
        call = calibration_call(self.engine, c.model, pod_runner_options(c),
                                keep_alive_value(c.keep_alive), c.calibrate_tokens)
        watcher = StreamWatcher(call.kind, timings.reader(self.engine.NAME))
        lines = LineSplitter()
        started = self._clock()
        first: float | None = None
        last: float | None = None
        seen = 0
        error = ""
        complete = False
        try:
            async with asyncio.timeout(CALIBRATION_DEADLINE_SECONDS):
                url = self._url(call.path)
                async with self.upstreams.session.post(url, json=call.body) as resp:
                    if resp.status != 200:
                        raise _NotReady(f"engine {call.path} answered {resp.status}")
                    async for chunk in resp.content.iter_any():
                        watcher.feed(chunk)
                        for line in lines.feed(chunk):
                            if _token_line(line):
                                seen += 1
                                last = self._clock()
                                first = last if first is None else first
                    watcher.close()
                    complete = watcher.error is None
                    error = watcher.error or ""
        except TimeoutError:
            error = f"stopped after {CALIBRATION_DEADLINE_SECONDS:g} s"
        except (aiohttp.ClientError, _NotReady, ValueError) as exc:
            error = f"calibration failed: {exc}"
        self.speed.calibration = calibration_from(
            watcher.timing, seen, first, last, self._clock() - started, time.time(), complete,
            error)
        self.speed.calibrating = False
        self._ready = _Ready()  # the next probe answers from the new state

    @property
    def calibration(self) -> Calibration | None:
        return self.speed.calibration

    async def _ask_engine(self) -> Any:
        """The engine's list of loaded models (Ollama's); _SERVING from an
        engine that loads its one model itself (llama-server), whose serving
        path answers 200 only once the model is loaded (EngineFacts)."""
        session = self.upstreams.session
        path = self.engine.SERVING_PATH
        async with asyncio.timeout(2.0), session.get(self._url(path)) as resp:
            _answered_ok(resp, path)
            if self.engine.LOAD_PATH is None:
                return _SERVING
            return await resp.json(content_type=None)

    def _start_warmup(self) -> None:
        """Load the model with the owned settings, once at a time."""
        if self._warmup is not None and not self._warmup.done():
            return
        self._warmup = asyncio.get_running_loop().create_task(self._load_model())

    async def _load_model(self) -> None:
        path = self.engine.LOAD_PATH
        if path is None:
            return
        body = load_request(self.config)
        url = self._url(path)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self.upstreams.session.post(url, json=body) as resp:
                await resp.read()

    def _url(self, path: str) -> URL:
        return self.upstreams.url(self.config.upstream, path)


class _NotReady(Exception):
    """The engine answered, not ready yet."""


def _token_line(line: bytes) -> bool:
    """A streamed line that carries a generated token (either format), roughly:
    only used to time a calibration cut at its deadline."""
    if not line.strip() or line.startswith(b":"):
        return False
    return b"[DONE]" not in line and b'"done":true' not in line.replace(b" ", b"")


def _answered_ok(resp: aiohttp.ClientResponse, path: str) -> None:
    if resp.status != 200:
        raise _NotReady(f"engine {path} answered {resp.status}")
