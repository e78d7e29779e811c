"""doctor's reading: everything that touches the network, processes or the API
server. The checks over what is read are pure (`localmodel.doctor.checks` for
one machine, `localmodel.doctor.cluster` for a cluster).

`gather_engine` (`doctor --local`) asks the engine's HTTP API at ``--engine-url``
(each engine's adapter says what: engines/<name>/doctor.py; Ollama: its version,
loaded models and Modelfiles; llama-server: its props, which report no thread
count) and, when the engine runs on this machine, its process (found by the
port it listens on): its command line and environment give the threads, its
own cgroup and cpuset give the CPU budget it really has.
`gather_cluster` reads the Nodes and Pods with the official client, and each
gateway's metrics through the API server's pod proxy or a URL given with
``--metrics-url``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from localmodel import GROUP, PLURAL, VERSION
from localmodel.doctor.checks import GATEWAY, EngineView
from localmodel.doctor.cluster import ClusterView, in_scope
from localmodel.doctor.metrics import GatewayStats, MetricsError, gateway_stats, parse_metrics
from localmodel.doctor.speed import CADVISOR_PATH, Watched, counters_moved, slow_replicas
from localmodel.engine_pods import engine_pods
from localmodel.engines.doctor import EngineProcess
from localmodel.engines.registry import ENGINES
from localmodel.facts.cgroup import read_cgroup_limits
from localmodel.facts.machine import MachineFacts
from localmodel.facts.topology import format_cpu_list
from localmodel.gateway_contract import ADMIN_PORT, METRICS_PATH

__all__ = ["gateway_metrics", "gather_cluster", "gather_engine", "process_budget"]

# cAdvisor's counters are read until the slow containers' counters moved (every
# this many seconds, for at most that long): the throttled share of now, not of
# the container's life.
CADVISOR_GAP_SECONDS = 3.0
CADVISOR_WAIT_SECONDS = 30.0


# The most doctor reads of one answer (an engine's or a gateway's: either may
# be anyone's image); past it the answer is refused (ValueError).
MAX_ANSWER_BYTES = 16 * 1024**2


def _get_json(url: str, body: Any = None, timeout: float = 5.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if data:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = _bounded(response.read(MAX_ANSWER_BYTES + 1), url)
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{url}: JSON nested deeper than doctor parses") from None


def _bounded(raw: bytes, url: str) -> bytes:
    if len(raw) > MAX_ANSWER_BYTES:
        raise ValueError(f"{url}: answer larger than {MAX_ANSWER_BYTES} bytes")
    return raw


def _get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return _bounded(response.read(MAX_ANSWER_BYTES + 1), url).decode("utf-8", "replace")


def _listening_process(url: str) -> EngineProcess | None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                continue
            try:
                proc = psutil.Process(conn.pid)
                argv = proc.cmdline()
                try:
                    env = proc.environ()
                except (psutil.AccessDenied, OSError):
                    env = {}
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            return EngineProcess(conn.pid, argv, env)
    return None


def process_budget(pid: int, host_cpus: int, root: Path = Path("/")) -> tuple[float, str]:
    """A process's own CPU budget: min(host CPUs, its cpuset, its cgroup quota)."""
    budgets: list[tuple[float, str]] = [(float(host_cpus), f"{host_cpus} host CPUs")]
    try:
        affinity = os.sched_getaffinity(pid)
        budgets.append((float(len(affinity)), f"cpuset {format_cpu_list(set(affinity))}"))
    except (AttributeError, OSError):
        pass
    limits = read_cgroup_limits(root, proc=str(pid))
    if limits.cpu_quota_milli is not None:
        budgets.append((limits.cpu_quota_milli / 1000, f"cgroup quota {limits.cpu_quota:g} CPUs"))
    value, why = min(budgets, key=lambda b: b[0])
    return value, f"pid {pid}: {why}"


def gather_engine(url: str, machine: MachineFacts) -> EngineView:
    """Ask the engine at ``url`` what it holds and how it runs; never raises."""
    url = url.rstrip("/")
    gateway = _gateway_stats(url)
    if gateway is not None:
        return EngineView(url=url, kind=GATEWAY, gateway=gateway, slots=gateway.slots)
    process = _listening_process(url)
    budget: tuple[float | None, str] = (None, "")
    if process is not None:
        try:
            budget = process_budget(process.pid, machine.host_cpus)
        except ValueError:
            budget = (None, "")
    common: dict[str, Any] = {
        "url": url,
        "pid": process.pid if process else None,
        "process_budget": budget[0],
        "process_budget_why": budget[1],
        "running_seconds": _running_seconds(process),
    }
    error: BaseException | None = None
    for engine in ENGINES.values():  # the first that answers as itself
        try:
            reading = engine.doctor.read(lambda path, body: _get_json(url + path, body), process)
        except (OSError, ValueError) as e:
            error = e
            continue
        read = {f.name: getattr(reading, f.name) for f in fields(reading)}
        weights = _weights_bytes(engine.doctor.pod_model(process.argv) if process else None)
        return EngineView(kind=engine.name, weights_bytes=weights, **read, **common)
    return EngineView(url=url, error=_why(error) if error is not None else "no engine")


def _running_seconds(process: EngineProcess | None) -> float | None:
    """How long the engine's process has run (None: not found here)."""
    if process is None:
        return None
    try:
        return max(0.0, time.time() - psutil.Process(process.pid).create_time())
    except psutil.Error:
        return None


def _weights_bytes(model: str | None) -> int | None:
    """The size of the model file a local engine's command line names (None:
    it names none, or not a file here: a registry name, say)."""
    if not model:
        return None
    try:
        size = Path(model).stat().st_size
    except (OSError, ValueError):
        return None
    return size if Path(model).is_file() else None


def _why(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        return str(e.reason)
    return str(e)


def _gateway_stats(url: str) -> GatewayStats | None:
    try:
        text = _get_text(url + METRICS_PATH)
        return gateway_stats(parse_metrics(text))
    except (OSError, ValueError, MetricsError):
        return None


# ---- a cluster -------------------------------------------------------------------


def gather_cluster(
    client: Any, metrics_urls: Mapping[str, str], timeout: float = 5.0,
    namespace: str | None = None,
) -> ClusterView:
    """Nodes, pods and every gateway's metrics (`namespace`: only its gateways
    and LocalModels; every pod still, for what shares their nodes); a metrics
    error is kept, not raised."""
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(client)
    nodes = client.sanitize_for_serialization(core.list_node()).get("items") or []
    pods = client.sanitize_for_serialization(core.list_pod_for_all_namespaces()).get("items") or []
    metrics: dict[str, str | Exception] = {}
    for pod in engine_pods(pods):
        if pod.gateway and in_scope(namespace, pod.namespace):
            metrics[pod.key] = gateway_metrics(core, pod.namespace, pod.name, timeout,
                                               metrics_urls.get(pod.key))
    # Every LocalModel: those of other namespaces hold nodes a scoped one may wake on
    # (cluster_findings scopes the rest).
    every_model = _local_models(client)
    models = [m for m in every_model
              if in_scope(namespace, (m.get("metadata") or {}).get("namespace"))]
    engines = {p.key: p for p in engine_pods(pods)}
    watched: dict[str, list[Watched]] = {}
    for slow in slow_replicas(models):
        engine = engines.get(f"{slow.namespace}/{slow.pod}")
        watched.setdefault(slow.node, []).extend(
            [Watched(slow.namespace, slow.pod, engine.container, engine.container_id)]
            if engine is not None and engine.container else [])
    cadvisor: dict[str, tuple[str, str] | Exception] = {}
    for node in sorted(watched):
        cadvisor[node] = _cadvisor_pair(core, node, timeout, watched[node])
    return ClusterView(nodes=nodes, pods=pods, metrics=metrics, models=every_model,
                       cadvisor=cadvisor, namespace=namespace, now=datetime.now(UTC))


def _local_models(client: Any) -> list[dict[str, Any]]:
    """Every LocalModel with its status; none when the API does not serve them."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    try:
        found: Any = CustomObjectsApi(client).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    except ApiException:
        return []
    return list(found.get("items") or []) if isinstance(found, dict) else []


def _cadvisor_pair(core: Any, node: str, timeout: float, watched: list[Watched]
                   ) -> tuple[str, str] | Exception:
    """Two samples of the kubelet's cAdvisor metrics between which the watched
    containers' CFS counters moved: cAdvisor refreshes a container's counters
    every 10-15 s (its housekeeping), so the second is read every
    CADVISOR_GAP_SECONDS until they moved (`counters_moved`), at most
    CADVISOR_WAIT_SECONDS."""
    before = _cadvisor(core, node, timeout)
    if isinstance(before, Exception):
        return before
    end = time.monotonic() + CADVISOR_WAIT_SECONDS
    while True:
        time.sleep(CADVISOR_GAP_SECONDS)
        after = _cadvisor(core, node, timeout)
        if isinstance(after, Exception):
            return after
        if counters_moved(before, after, watched) or time.monotonic() > end:
            return before, after


def _cadvisor(core: Any, node: str, timeout: float) -> str | Exception:
    try:
        return str(core.connect_get_node_proxy_with_path(node, CADVISOR_PATH,
                                                         _request_timeout=timeout))
    except Exception as e:  # every failure becomes a finding
        return _short(e)


def gateway_metrics(core: Any, namespace: str, pod: str, timeout: float = 5.0,
                    url: str | None = None) -> str | Exception:
    """A gateway pod's metrics text, through the API server's pod proxy (or from
    `url`); a failure is returned, not raised, as a short reason."""
    try:
        if url is not None:
            return _fetch(url, timeout)
        return str(core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod}:{ADMIN_PORT}", namespace, METRICS_PATH.lstrip("/"), _request_timeout=timeout))
    except Exception as e:  # every failure becomes a finding
        return _short(e)


class _Unreadable(Exception):
    """A gateway's metrics read that failed, shortened to its status and reason: what the
    finding says."""


def _short(e: Exception) -> Exception:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    if status is not None:
        return _Unreadable(f"{status} {reason or ''}".strip())
    return _Unreadable(str(e) or type(e).__name__)


def _fetch(url: str, timeout: float) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:
        return _bounded(response.read(MAX_ANSWER_BYTES + 1), url).decode("utf-8", "replace")
