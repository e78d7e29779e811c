"""Stand-in gateways and an in-process router for the idle journeys on kwok
(tests/e2e/test_idle_kwok.py) and the idle simulation on kwok
(benchmarks/idle_kwok.py).

kwok runs no container, so each model pod's gateway is played by the test on
the host, at the pod IP kwok gave it (added to `lo`), on the gateway's two
ports: `/speed` with the `activity` the test sets, `/slots`, `/readyz`, the
signed `POST /yield`, and chat completions (a stream that lasts until the
test ends it, when asked for). The close is judged by the gateway's own
`Door` (gateway/door.py) on this stand-in's counts, checked at the call; the
mark is verified with the public half of the signing key the operator keeps
in its Secret (gateway_contract/marks.py `verify`, purpose `yield`).

The stand-in's clock can be moved on (`Standin.idle_for`): a model "quiet for
an hour" needs no hour of the test; and it can run faster than the host's
(`Gateways(pace=...)`): the benchmark's models sleep after `after` of their
own time. A non-streamed answer can take `answer_s` (in flight meanwhile),
and every relayed held request's signed wait (`WOKE_HEADER`, ms) is kept.
Counted: every 409, every close accepted with a request in flight and every
pod deleted while its stand-in had one in flight (both are busy evictions,
which must stay 0).

`idle_plane` starts the whole: the kwok control plane, the chart's RBAC with
the router on, the real operator with the router named, the stand-ins and
the router.

`Router` is the real router (router/server.py) with the real cluster source
(router/follow.py) in a thread of its own, at an address on `lo` that the
operator finds through an EndpointSlice labelled as the chart's router
Service's are (controller/wake_watch.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from localmodel.gateway.door import BadYield, Door, Verdict, parse_yield
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT
from localmodel.gateway_contract.headers import WOKE_HEADER, woke_ms
from localmodel.gateway_contract.marks import (
    MARK_HEADER,
    YIELD,
    key_from_pem,
    verify,
    yield_session,
)
from localmodel.kube import api_client
from localmodel.router.config import RouterConfig
from localmodel.router.follow import ClusterSource
from localmodel.router.server import RunningRouter, start_router
from tests.harness import TestCluster
from tests.harness.chart import NAMESPACE, operator_objects, render_chart
from tests.harness.fixtures import operator_cluster, operator_running, tools_or_fail
from tests.harness.nodes import NodeShape, local_volume_manifests, node_manifest
from tests.harness.operator import RBAC_KINDS, OperatorProcess
from tests.harness.processes import wait_until
from tests.harness.tools import TOOL_NAMES

LEASE_S = 60.0  # the gateway's default close lease
POD_NET = "10.244.0."  # kwok's --cidr in tests/harness/cluster.py
PRESERVED = 64  # pod addresses served from the start
SPEED_CALIBRATION = {"decode_tokens_per_second": 20.0, "prefill_tokens_per_second": 200.0,
                     "generated_tokens": 64, "prompt_tokens": 64, "seconds": 3.5,
                     "complete": True, "at": 1.0, "error": None}


class Loop:
    """One asyncio loop in a daemon thread; `run` waits for a coroutine's result."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@dataclass
class Standin:
    """One pod's gateway: its counts, its door, what it answered."""

    namespace: str
    pod: str
    model: str  # the LocalModel's name
    key: Ed25519PublicKey
    shift: float = 0.0  # seconds this stand-in's clock is ahead of the host's
    pace: float = 1.0  # its clock's seconds per host second
    answer_s: float = 0.0  # a non-streamed answer's time
    born: float = field(default_factory=lambda: time.monotonic())  # when it began
    refused: int = 0  # 409s
    closes: int = 0  # 200 closed
    busy_closes: int = 0  # closes accepted with a request in flight (must stay 0)
    yields_asked: int = 0  # POST /yield calls with a valid mark
    forged: int = 0  # POST /yield calls without one
    served: int = 0  # chat completions answered
    held_ms: list[int] = field(default_factory=list)  # relayed held requests' waits
    release: asyncio.Event = field(default_factory=asyncio.Event)
    shown: dict[str, Any] | None = None  # an activity /speed shows instead of the true one
    door: Door = field(init=False)

    def __post_init__(self) -> None:
        self.door = Door(LEASE_S, lambda: 0, self.clock)

    def clock(self) -> float:
        return self.born + self.pace * (time.monotonic() - self.born) + self.shift

    def idle_for(self, seconds: float) -> None:
        """Move this stand-in's clock on: it has been quiet `seconds` longer."""
        self.shift += seconds

    def speed(self) -> dict[str, Any]:
        return {"engine": "llama-server", "model": self.model, "threads": 3,
                "calibrating": False, "calibration": SPEED_CALIBRATION,
                "recent": {"window_seconds": 60, "requests": 0},
                "totals": {"requests": self.served, "generated_tokens": 8 * self.served,
                           "decode_seconds": 0.4 * self.served, "prompt_tokens": 8 * self.served,
                           "prefill_seconds": 0.04 * self.served},
                "activity": self.shown or self.door.activity()}

    def lag(self, activity: dict[str, Any] | None) -> None:
        """Show `activity` in /speed from now on (None: the true one again),
        as a reading a moment old shows what was true then; the close is
        still judged on the true counts at the call."""
        self.shown = activity

    def decide(self, raw: bytes, mark: str | None) -> Verdict:
        """The gateway's answer to a close (gateway/server.py's, on this
        stand-in's counts at the call)."""
        try:
            call = parse_yield(raw)
        except BadYield as exc:
            return Verdict(400, {"error": str(exc)})
        session = yield_session(call.reason, call.idle_at_least)
        if not verify(self.key, mark, YIELD, self.namespace, self.pod, session, time.time()):
            self.forged += 1
            return Verdict(403, {"error": "not the operator's mark"})
        self.yields_asked += 1
        in_flight = self.door.in_flight
        verdict = self.door.decide(call)
        if verdict.status == 409:
            self.refused += 1
        elif verdict.body.get("closed") is True:
            self.closes += 1
            self.busy_closes += in_flight > 0
        return verdict


def slots(standin: Standin) -> dict[str, Any]:
    busy = standin.door.in_flight
    return {"model": standin.model, "engine": "llama-server", "total": 1, "busy": min(busy, 1),
            "free": 0 if busy else 1, "queued": {"foreground": 0, "background": 0},
            "queue_limit": 16, "threads": 3, "context": 4096, "owned_sessions": []}


def completion(model: str, text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}


async def chat(standin: Standin, request: web.Request) -> web.StreamResponse:
    """A chat completion, counted in flight while it runs; `"stream": true`
    streams a chunk a second until the test sets `release`."""
    body = json.loads(await request.read() or b"{}")
    if not standin.door.arrive():
        return web.json_response({"error": {"message": "asleep"}}, status=503,
                                 headers={"X-LocalModel-Asleep": "1", "Retry-After": "15"})
    held = woke_ms(request.headers.get(WOKE_HEADER))
    if held is not None:
        standin.held_ms.append(held)
    try:
        if not body.get("stream"):
            if standin.answer_s:
                await asyncio.sleep(standin.answer_s)
            standin.served += 1
            return web.json_response(completion(standin.model, f"{standin.pod} here"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        while not standin.release.is_set():
            chunk = {"object": "chat.completion.chunk", "model": standin.model,
                     "choices": [{"index": 0, "delta": {"content": "."}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(1.0)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        standin.served += 1
        return resp
    finally:
        standin.door.end()


class Gateways:
    """A stand-in at every Ready model pod's IP in the namespaces it follows,
    kept in step with the pods (`sync`, from a thread of its own)."""

    def __init__(self, cluster: TestCluster, key: Ed25519PublicKey, *, pace: float = 1.0,
                 answer_s: float = 0.0) -> None:
        self.cluster = cluster
        self.key = key
        self.pace, self.answer_s = pace, answer_s
        self.loop = Loop("standin-gateways")
        self.namespaces: set[str] = set()
        self.by_ip: dict[str, Standin] = {}
        self.runners: dict[str, web.AppRunner] = {}
        self.gone: list[Standin] = []  # stand-ins whose pod was deleted
        self.evicted_busy: list[Standin] = []  # deleted with a request in flight
        # kwok hands out pod IPs from the start of the harness's --cidr: these
        # are served before any pod has them, so a replica is answered from
        # its first Ready moment (a router relays at once).
        for last in range(1, PRESERVED + 1):
            self.loop.run(self._serve(f"{POD_NET}{last}"))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="standin-sync", daemon=True)
        self._thread.start()

    def of(self, namespace: str, model: str) -> list[Standin]:
        """The live stand-ins of a model."""
        return [s for s in list(self.by_ip.values())
                if s.namespace == namespace and s.model == model]

    @property
    def busy_evictions(self) -> int:
        """Pods deleted while their stand-in had a request in flight."""
        return len(self.evicted_busy)

    def in_namespace(self, namespace: str) -> list[Standin]:
        """Every stand-in a namespace's models ever had."""
        return [s for s in [*self.by_ip.values(), *self.gone] if s.namespace == namespace]

    def all_of(self, namespace: str, model: str) -> list[Standin]:
        """Every stand-in a model ever had (its deleted pods' too)."""
        return self.of(namespace, model) + [s for s in list(self.gone)
                                            if s.namespace == namespace and s.model == model]

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the API server's hiccup: try again
                print(f"stand-in sync: {type(exc).__name__}: {exc}")
            self._stop.wait(0.3)

    def live(self) -> dict[str, tuple[str, str, str]]:
        """Each live model pod's IP: its namespace, name and model."""
        live: dict[str, tuple[str, str, str]] = {}
        for ns in list(self.namespaces):
            for pod in self.cluster.api().get(f"/api/v1/namespaces/{ns}/pods")["items"]:
                meta, status = pod["metadata"], pod.get("status") or {}
                model = (meta.get("labels") or {}).get("localmodel.dev/name")
                ip = status.get("podIP")
                if model and ip and not meta.get("deletionTimestamp"):
                    live[ip] = (ns, meta["name"], model)
        return live

    def sync(self) -> None:
        with self._lock:
            live = self.live()
            self._replace(live)
        for ip in live:
            if ip not in self.runners:
                self.loop.run(self._serve(ip))

    def _replace(self, live: dict[str, tuple[str, str, str]]) -> None:
        """Retire the stand-ins whose pods are gone; one for each new pod."""
        for ip, standin in list(self.by_ip.items()):
            if live.get(ip) != (standin.namespace, standin.pod, standin.model):
                if standin.door.in_flight > 0:
                    self.evicted_busy.append(standin)
                self.gone.append(self.by_ip.pop(ip))
        for ip, (ns, pod, model) in live.items():
            if ip not in self.by_ip:
                self.by_ip[ip] = Standin(ns, pod, model, self.key, pace=self.pace,
                                         answer_s=self.answer_s)

    def _adopt(self) -> None:
        """Called by a server whose address has no stand-in yet (kwok gave it
        to a new pod since the last sync): look again at once."""
        with self._lock:
            self._replace(self.live())

    async def _serve(self, ip: str) -> None:
        subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=False,
                       capture_output=True)
        app = web.Application()
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(ip, request)

        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        for port in (GATEWAY_PORT, ADMIN_PORT):
            await web.TCPSite(runner, ip, port).start()
        self.runners[ip] = runner

    async def _handle(self, ip: str, request: web.Request) -> web.StreamResponse:
        standin = self.by_ip.get(ip)
        if standin is None or request.method == "POST":  # a new pod at an address used before
            await asyncio.to_thread(self._adopt)
            standin = self.by_ip.get(ip)
        if standin is None:
            return web.json_response({"error": "no pod here"}, status=503)
        path = request.path
        if path == "/speed":
            return web.json_response(standin.speed())
        if path == "/slots":
            return web.json_response(slots(standin))
        if path in ("/readyz", "/healthz"):
            return web.json_response({"ok": True})
        if path == "/yield" and request.method == "POST":
            verdict = standin.decide(await request.read(), request.headers.get(MARK_HEADER))
            return web.json_response(verdict.body, status=verdict.status)
        if path.endswith("/chat/completions") and request.method == "POST":
            return await chat(standin, request)
        return web.json_response({})

    def end_streams(self, namespace: str, model: str) -> None:
        for standin in self.of(namespace, model):
            self.loop.loop.call_soon_threadsafe(standin.release.set)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for runner in list(self.runners.values()):
            self.loop.run(runner.cleanup())
        self.loop.stop()
        for ip in self.runners:
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], check=False,
                           capture_output=True)


ROUTER_IP = "10.254.44.1"  # on lo; outside kwok's pod addresses


@dataclass
class Router:
    """The real router at ROUTER_IP (its admin port the chart's), following
    every namespace through the admin's kubeconfig."""

    cluster: TestCluster
    port: int = 18080
    running: RunningRouter | None = None
    source: ClusterSource | None = None
    loop: Loop | None = None

    def start(self, log: Callable[[str], None] = print) -> None:
        subprocess.run(["ip", "addr", "add", f"{ROUTER_IP}/32", "dev", "lo"], check=False,
                       capture_output=True)
        self.source = ClusterSource(api_client(str(self.cluster.admin_kubeconfig)),
                                    watch_seconds=30).start()
        assert self.source.wait_synced(60), "the router's cluster source did not sync"
        self.loop = Loop("router")
        config = replace(RouterConfig(), listen_host=ROUTER_IP, listen_port=self.port,
                         admin_host=ROUTER_IP, poll_interval=1.0)
        self.running = self.loop.run(start_router(config, self.source, log))

    @property
    def url(self) -> str:
        return f"http://{ROUTER_IP}:{self.port}"

    def stop(self) -> None:
        if self.loop is not None and self.running is not None:
            self.loop.run(self.running.stop())
        if self.source is not None:
            self.source.stop()
        if self.loop is not None:
            self.loop.stop()
        subprocess.run(["ip", "addr", "del", f"{ROUTER_IP}/32", "dev", "lo"], check=False,
                       capture_output=True)


def router_endpoints(namespace: str) -> list[dict[str, Any]]:
    """A Service without selector and its EndpointSlice at ROUTER_IP, labelled
    as the chart labels the router Service (what WakeWatch lists)."""
    labels = {"app.kubernetes.io/component": "router"}
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "localmodel-router", "namespace": namespace, "labels": labels},
         "spec": {"ports": [{"name": "admin", "port": ADMIN_PORT}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "localmodel-router-host", "namespace": namespace,
                      "labels": {**labels, "kubernetes.io/service-name": "localmodel-router",
                                 "endpointslice.kubernetes.io/managed-by": "e2e.localmodel.dev"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [ROUTER_IP], "conditions": {"ready": True}}],
         "ports": [{"name": "admin", "port": ADMIN_PORT, "protocol": "TCP"}]},
    ]


JOURNEY = "e2e.localmodel.dev/journey"  # a node's label: the namespace whose models select it
SIGNING_SECRET = "localmodel-operator-router-signing"  # the chart's (release localmodel-operator)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "no-fake-nodes.yaml"


@dataclass
class IdlePlane:
    """What `idle_plane` runs: the cluster, the operator, the stand-ins, the router."""

    cluster: TestCluster
    operator: OperatorProcess
    gateways: Gateways
    router: Router


def router_args(*extra: str) -> tuple[str, ...]:
    """The operator's flags with the router on (its namespace, its signing Secret)."""
    return ("--router-namespace", NAMESPACE, "--router-signing-secret", SIGNING_SECRET, *extra)


@contextmanager
def idle_plane(operator_args: Sequence[str], *, pace: float = 1.0, answer_s: float = 0.0,
               log_lines: int = 60, router_log: Callable[[str], None] = print
               ) -> Iterator[IdlePlane]:
    """The kwok control plane without nodes, the chart's RBAC with the router
    on, `localmodel run` with `operator_args` (`router_args(...)`), stand-in
    gateways (`pace`, `answer_s`) and the router (its log lines to
    `router_log`); all stopped afterwards."""
    with operator_cluster(tools_or_fail((*TOOL_NAMES, "lmhealth")), FIXTURE) as cluster:
        assert cluster.tools is not None
        rendered = render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version,
                                set_values=("probe.enabled=false", "router.enabled=true"))
        cluster.apply([m for m in operator_objects(rendered) if m["kind"] in RBAC_KINDS])
        cluster.apply(router_endpoints(NAMESPACE))
        with operator_running(cluster, "operator-idle", extra_args=tuple(operator_args),
                              log_lines=log_lines) as operator:
            path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{SIGNING_SECRET}"
            api = cluster.api()
            wait_until("the operator's signing Secret",
                       lambda: api.status_of("GET", path) == 200, timeout=60)
            pem = base64.b64decode(api.get(path)["data"]["signing-key.pem"])
            gateways = Gateways(cluster, key_from_pem(pem).public_key(), pace=pace,
                                answer_s=answer_s)
            router = Router(cluster)
            try:
                router.start(router_log)
                yield IdlePlane(cluster, operator, gateways, router)
            finally:
                router.stop()
                gateways.stop()


def add_nodes(cluster: TestCluster, ns: str, *names: str) -> list[str]:
    """4-CPU kwok nodes `<ns>-<name>` labelled `JOURNEY: ns`, each with local
    disks: one model each (cpu 3)."""
    made = []
    for name in names:
        shape = NodeShape(name=f"{ns}-{name}", cpu="4", memory="16Gi",
                          labels={JOURNEY: ns, "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"},
                          volumes=("20Gi", "20Gi", "20Gi"))
        cluster.api().create("/api/v1/nodes", node_manifest(shape))
        for pv in local_volume_manifests(shape, "local-disk"):
            cluster.api().create("/api/v1/persistentvolumes", pv)
        made.append(shape.name)
    return made
