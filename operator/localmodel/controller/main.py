"""`localmodel run`: wire config, credentials, kopf, the Lease, the reconciler,
and the health and metrics endpoints together, then run until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from localmodel.controller.config import ConfigError, OperatorConfig, parse_config
from localmodel.controller.handlers import build_registry
from localmodel.controller.leader import LeaderElector, LeaseThread
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.speed import SpeedReader
from localmodel.controller.supervise import Job, Supervisor, watch_api
from localmodel.controller.wake_watch import WakeWatch, slice_finder
from localmodel.controller.writer import Kube
from localmodel.kube import Credentials, KubeconfigError, credentials
from localmodel.metrics import render
from localmodel.settings import PortTaken

log = logging.getLogger("localmodel.run")
# Connections of the Lease's own client (a GET and a PUT per renewal, one at a time).
LEASE_CONNECTIONS = 2


class JsonFormatter(logging.Formatter):
    """Writes a log record as one JSON line (time, level, logger, message, exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: OperatorConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("kopf").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


async def _serve(app: web.Application, where: tuple[str, int] | None,
                 flag: str) -> web.AppRunner | None:
    if where is None:
        return None
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, where[0], where[1]).start()
    except OSError as exc:
        await runner.cleanup()
        raise PortTaken(flag, where[0], where[1], exc) from None
    return runner


async def operate(config: OperatorConfig, creds: Credentials,
                  stop: asyncio.Event | None = None) -> int:
    """Run until stopped: SIGTERM or SIGINT, or `stop` when given (then no
    signal handlers are set: the caller owns them)."""
    identity = config.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    metrics = OperatorMetrics()
    stop = stop or _stop_on_signals()
    ready, leading = asyncio.Event(), asyncio.Event()  # leading: set from the Lease's thread
    elector = LeaderElector(
        None, config.leader_namespace, config.leader_name, identity,
        lease_seconds=config.lease_seconds, renew_seconds=config.renew_seconds,
        on_lost=lambda why: metrics.leases_lost.inc(labels=(why,)))

    # The Lease runs on a thread of its own, with a client of its own
    # (`leader.LeaseThread`): a renewal waits neither for this loop, which a pass
    # holds for seconds, nor behind a pass's writes. Every write asks the
    # elector first (the fence).
    async with Kube(creds, on_write=metrics.on_write, concurrency=config.write_concurrency,
                    identity=identity, fence=elector.holds) as kube:
        reconciler = Reconciler(config, kube, metrics, identity=identity)
        reader = SpeedReader(reconciler.speed, metrics.speed_reads, reconciler.trigger)
        reconciler.speed_wake = reader.wake.set
        elector.on_change = _leadership(asyncio.get_running_loop(), leading, metrics,
                                        reconciler)
        lease = LeaseThread(elector, lambda: Kube(creds, on_write=metrics.on_write,
                                                  concurrency=LEASE_CONNECTIONS,
                                                  identity=identity))
        registry = build_registry(reconciler, creds)
        runners = await _serve_endpoints(config, metrics, ready)
        kopf_task, kopf_ready = _start_kopf(config, registry, identity, stop)

        async def mark_ready() -> None:
            await kopf_ready.wait()
            ready.set()

        supervisor = Supervisor(metrics.task_restarts)
        jobs = [Job("leader", lease.run, on_failure=elector.step_down),
                Job("reconcile", lambda: reconciler.run(leading)),
                Job("speed", lambda: reader.run(leading)),
                Job("close", lambda: reconciler.closer.run(leading))]
        if config.router_namespace:  # spec.idle's wakes: what the routers hold
            watch = WakeWatch(slice_finder(kube, config.router_namespace), reconciler.trigger)
            reconciler.wake_watch = watch
            jobs.append(Job("wake", lambda: watch.run(leading)))
        api_watch = asyncio.create_task(watch_api(lambda: elector.last_answer), name="api")
        tasks = [
            kopf_task,
            *(asyncio.create_task(supervisor.keep(job), name=job.name) for job in jobs),
            asyncio.create_task(mark_ready(), name="ready"),
            api_watch,
        ]
        log.info("localmodel operator %s starting (namespaces: %s, Lease %s/%s)", identity,
                 ", ".join(config.namespaces) or "all", config.leader_namespace,
                 config.leader_name)
        code = await _until_fatal([kopf_task, api_watch], stop)
        stop.set()
        await _shut_down(reconciler, lease, tasks, kopf_task, runners)
    log.info("localmodel operator stopped")
    return code


async def _shut_down(reconciler: Reconciler, lease: LeaseThread, tasks: list[asyncio.Task[Any]],
                     kopf_task: asyncio.Task[Any], runners: Sequence[Any]) -> None:
    """Stop in order: no pass writes past this point, the Lease is given back
    (the next replica need not wait it out), the tasks end, the endpoints close."""
    reconciler.abort_pass()
    await lease.release()
    await _stop_tasks(tasks, kopf_task)
    for runner in runners:
        if runner is not None:
            await runner.cleanup()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _leadership(loop: asyncio.AbstractEventLoop, leading: asyncio.Event,
                metrics: OperatorMetrics, reconciler: Reconciler) -> Callable[[bool], None]:
    """The elector's `on_change`, called on the Lease's thread: hands the news to
    this loop, where a pass starts on winning the Lease and the pass under way
    stops on losing it."""

    def here(now_leading: bool) -> None:
        metrics.leader = 1.0 if now_leading else 0.0
        if now_leading:
            leading.set()
            reconciler.trigger()
        else:
            leading.clear()
            reconciler.abort_pass()

    def handover(now_leading: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to stop
            loop.call_soon_threadsafe(here, now_leading)

    return handover


async def _serve_endpoints(config: OperatorConfig, metrics: OperatorMetrics,
                           ready: asyncio.Event) -> list[web.AppRunner | None]:
    """/healthz and /readyz (ready once kopf is), and /metrics, each where configured."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready.is_set():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="starting\n")

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(text=render(metrics.all()),
                            content_type="text/plain", charset="utf-8")

    health_app = web.Application()
    health_app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    metrics_app = web.Application()
    metrics_app.add_routes([web.get("/metrics", metrics_page)])
    health = await _serve(health_app, config.health_listen, "health-listen")
    try:
        return [health, await _serve(metrics_app, config.metrics_listen, "metrics-listen")]
    except PortTaken:
        if health is not None:
            await health.cleanup()
        raise


def _start_kopf(config: OperatorConfig, registry: Any, identity: str, stop: asyncio.Event
                ) -> tuple[asyncio.Task[Any], asyncio.Event]:
    """kopf's operator as a task, and the flag it sets once its watches are up."""
    import kopf

    kopf_ready = asyncio.Event()
    kopf_task = asyncio.create_task(kopf.operator(
        registry=registry,
        # kopf's own default asks the password database for the user name,
        # which fails in the image (uid 65532 has no passwd entry).
        identity=identity,  # type: ignore[arg-type]  # kopf's NewType of str
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        standalone=True,
        stop_flag=stop,
        ready_flag=kopf_ready,
    ), name="kopf")
    return kopf_task, kopf_ready


async def _until_fatal(fatal: list[asyncio.Task[Any]], stop: asyncio.Event) -> int:
    """Wait for a stop signal (0) or for one of the `fatal` tasks to end (1,
    logged with why): kopf's watches, or the API server lost for too long
    (`supervise`). Every other task is kept running by the supervisor."""
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*fatal, stopper], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for task in done:
        if task is stopper:
            continue
        code = 1
        if task.cancelled():
            log.error("exiting: %s was cancelled", task.get_name())
        elif task.exception() is not None:
            log.error("exiting: %s failed: %r", task.get_name(), task.exception())
        else:
            log.error("exiting: %s", task.result() or f"{task.get_name()} ended")
    if not stopper.done():
        stopper.cancel()
    return code


async def _stop_tasks(tasks: list[asyncio.Task[Any]], kopf_task: asyncio.Task[Any]) -> None:
    """Cancel every task but kopf's, which gets 10 s to stop by its flag."""
    for task in tasks:
        if task is not kopf_task:
            task.cancel()
    try:
        await asyncio.wait_for(kopf_task, timeout=10)
    except (TimeoutError, asyncio.CancelledError, Exception):
        kopf_task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def run_main(argv: Sequence[str]) -> int:
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as exc:
        print(f"localmodel run: {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    try:
        creds = credentials(config.kubeconfig)
    except KubeconfigError as exc:
        print(f"localmodel run: {exc}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(operate(config, creds))
    except PortTaken as exc:
        print(f"localmodel run: {exc}", file=sys.stderr)
        return 2
