"""The doorman (`localmodel gateway --doorman`): what answers a released
sleeper's own Service while it has no replica (docs/idle.md, Through the
model's own Service). The gateway's image and settings, no engine, nothing
proxied: a direct caller is told, not held.

- Every slot route (generation, chat, embeddings; Ollama's and OpenAI's)
  answers `503` with `X-LocalModel-Asleep: 1` and `Retry-After` (the model's
  last wake, `--wake-seconds`, else a closed gateway's), in the caller's
  API's error shape (gateway_contract/replies.py), naming the model and, with
  `--router-url`, the router, which holds a request until the model is awake.
  Each counts in `/speed` `activity.arrived`: a wish to wake, which the
  operator reads as it reads a closed gateway's (activity `closed: true`).
- Listings (`/api/tags`, `/api/ps`, `/v1/models`) answer an empty list in
  their API's shape (nothing is loaded here); the other metadata routes
  (`/api/show`, `/api/version`) the 503, not counted; `/healthz` and `/readyz`
  200: the doorman is Ready, so the Service sends callers to it.
- With `--keys-file`, every one of those routes needs a key, as the
  gateway's do: a refused key gets 401 and never counts as a wish to wake.
  The router's key check (`KEY_CHECK_PATH`) answers as the gateway's does.

Bounded like the gateway: it never reads a request body (aiohttp discards
what a caller sends, for at most its lingering time), headers are aiohttp's
bounded lines, a connection idle or slow with its headers for --idle-timeout
is closed, and each answer is made at once, without a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from localmodel.gateway.keys import KeysFile, key_check_answer
from localmodel.gateway.routes import ROUTES, Route
from localmodel.gateway.server import KEYS_CHECK_SECONDS
from localmodel.gateway.speed import SpeedRecord, speed_document
from localmodel.gateway_contract import (
    HEALTH_PATH,
    METRIC_PREFIX,
    METRICS_PATH,
    READY_PATH,
    SPEED_PATH,
    GatewayConfig,
)
from localmodel.gateway_contract import client_api as api
from localmodel.gateway_contract.headers import ASLEEP, ASLEEP_RETRY_AFTER_S, ASLEEP_VALUE
from localmodel.gateway_contract.keys import KEY_CHECK_PATH
from localmodel.gateway_contract.replies import error_response, json_response
from localmodel.settings import PortTaken

# The listings, in each API's shape: nothing is loaded here.
LISTINGS: dict[str, dict[str, Any]] = {
    api.TAGS_PATH: {"models": []},
    api.PS_PATH: {"models": []},
    "/v1/models": {"object": "list", "data": []},
}


def caller_model(config: GatewayConfig) -> str:
    """The model as a caller names it at the router: `namespace/name`."""
    model = config.model or "this model"
    return f"{config.pod_namespace}/{model}" if config.pod_namespace else model


def asleep_message(config: GatewayConfig, retry_after: int) -> str:
    """What a caller of a released model reads: when to come back, and where
    a request would wait instead."""
    model = caller_model(config)
    text = f"{model} is asleep and waking: it answers here in about {retry_after} s"
    if config.router_url:
        text += (f"; or send through the router ({config.router_url}, model `{model}`), "
                 "which holds your request until it is awake")
    return text


class Doorman:
    """Answers a released model's Service: routes, probes, the router's key
    check; keeps the wishes to wake (`activity`)."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._clock = clock
        self._started = clock()
        self.arrived = 0  # slot requests answered (their keys passed): wishes to wake
        self.retry_after = config.wake_seconds or ASLEEP_RETRY_AFTER_S
        self.message = asleep_message(config, self.retry_after)
        # With --keys-file, a file that cannot be read or used stops the start.
        self.keys = KeysFile(config.keys_file, log or _stderr_line) if config.keys_file else None
        self._keys_task: asyncio.Task[None] | None = None

    def answer(self, route: Route, authorization: str | None) -> web.Response:
        """One request's answer, decided at once (no body is read)."""
        if self.keys is not None and self.keys.ring.find(authorization) is None:
            return error_response(
                401, "a valid API key is required (Authorization: Bearer <key>)",
                {"WWW-Authenticate": 'Bearer realm="localmodel"'}, openai=route.is_openai)
        listing = LISTINGS.get(route.path)
        if listing is not None:
            return json_response(200, listing)
        if route.uses_slot:
            self.arrived += 1
        headers = {ASLEEP: ASLEEP_VALUE, "Retry-After": str(self.retry_after)}
        return error_response(503, self.message, headers, openai=route.is_openai)

    def activity(self) -> dict[str, Any]:
        """The `activity` of GET /speed: never busy, always closed; `arrived`
        counts the wishes to wake; idle since it started (a refused arrival
        is no work, as at a closed gateway)."""
        idle = round(max(0.0, self._clock() - self._started), 3)
        return {"in_flight": 0, "queued": 0, "arrived": self.arrived,
                "idle_seconds": idle, "closed": True}

    # ---- the apps ----------------------------------------------------------

    def app(self) -> web.Application:
        """The inference port's app: the gateway's routes, the probes, the key check."""
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for route in ROUTES:
            for method in route.methods:
                app.router.add_route(method, route.path, self._handler(route))
        app.router.add_get(KEY_CHECK_PATH, self.handle_key_check)
        app.router.add_get(HEALTH_PATH, _ok)
        app.router.add_get(READY_PATH, _ok)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def admin_app(self) -> web.Application:
        """The admin port's app: /speed (the activity the operator reads),
        /metrics, /healthz."""
        app = web.Application(client_max_size=1024)
        app.router.add_get(SPEED_PATH, self.handle_speed)
        app.router.add_get(METRICS_PATH, self.handle_metrics)
        app.router.add_get(HEALTH_PATH, _ok)
        return app

    def _handler(self, route: Route) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            return self.answer(route, request.headers.get("Authorization"))

        return handler

    async def handle_key_check(self, request: web.Request) -> web.Response:
        return key_check_answer(None if self.keys is None else self.keys.ring, request.headers)

    async def handle_speed(self, request: web.Request) -> web.Response:
        c = self.config
        doc = speed_document(SpeedRecord(), self._clock(), c.engine, c.model, None)
        return json_response(200, {**doc, "activity": self.activity()})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        p = METRIC_PREFIX
        text = (f"# HELP {p}closed 1 while the gateway is closed and refuses slot requests "
                f"with 503, else 0.\n# TYPE {p}closed gauge\n{p}closed 1\n")
        return web.Response(body=text.encode(), headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _on_startup(self, app: web.Application) -> None:
        if self.keys is not None:
            self._keys_task = asyncio.create_task(self._watch_keys(self.keys))

    async def _watch_keys(self, keys: KeysFile) -> None:
        """A mounted Secret changes in place: look for a change now and then."""
        while True:
            await asyncio.sleep(KEYS_CHECK_SECONDS)
            keys.check()

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._keys_task is not None:
            self._keys_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keys_task


async def _ok(request: web.Request) -> web.Response:
    return json_response(200, {"status": "ok"})


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class RunningDoorman:
    """One doorman started: its runners and ports."""

    doorman: Doorman
    runners: tuple[web.AppRunner, ...]
    port: int
    admin_port: int

    async def stop(self) -> None:
        for runner in reversed(self.runners):
            await runner.cleanup()


async def _site(app: web.Application, config: GatewayConfig, flag: str, host: str,
                port: int, started: list[web.AppRunner]) -> int:
    """Serve `app` on host:port (0: any free port); the port it got."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           keepalive_timeout=config.idle_timeout, shutdown_timeout=1.0)
    await runner.setup()
    started.append(runner)
    try:
        await web.TCPSite(runner, host, port, backlog=1024).start()
    except OSError as exc:
        for r in reversed(started):
            await r.cleanup()
        raise PortTaken(flag, host, port, exc) from None
    return int(runner.addresses[0][1]) if runner.addresses else port


async def start_doorman(config: GatewayConfig) -> RunningDoorman:
    """Start answering on --listen and --admin-listen; port 0 picks a free port."""
    doorman = Doorman(config)
    runners: list[web.AppRunner] = []
    port = await _site(doorman.app(), config, "listen", config.listen_host,
                       config.listen_port, runners)
    admin_host, admin_port = config.admin_address
    admin = await _site(doorman.admin_app(), config, "admin-listen", admin_host, admin_port,
                        runners)
    return RunningDoorman(doorman, tuple(runners), port, admin)
