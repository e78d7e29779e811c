"""How fast the operator converges, and what it costs the API server, as N grows.

For each N: a fresh real control plane (etcd, kube-apiserver with an audit log,
controller-manager, scheduler, kwok) with N fake nodes (8 CPUs, 32 GiB, one
local disk each), the CRD and the chart's RBAC, `localmodel run` as the
chart's identity; then N exclusive LocalModels are applied at once and the
clock runs until every one is Ready. API requests by the operator's user come
from the audit log. Printed side by side: seconds to all Ready, and reads and
writes per model (writes per model should not depend on N).

    python benchmarks/converge.py                   # N = 50, 100, 300, 1000; memory at 10k nodes
    python benchmarks/converge.py --sizes 300 --memory 0  # one N, no memory section
    python benchmarks/converge.py --sizes --memory 10000  # only the memory, 10k nodes, 5k models
    python benchmarks/converge.py --quick           # CI: N = 20, a 10 s idle window, memory at 800
    python benchmarks/converge.py --json            # one JSON object as the last line

The operator's reads of the gateways' speed (docs/operator.md, Speed) are
counted from its metrics (`localmodel_operator_gateway_reads_total{result}`,
`..._read_bytes_total`), by result and per model: once every model is Ready,
and again after an idle window with no traffic (by default 60 s), which
should add none. kwok runs no gateways: what a kwok pod's IP answers depends
on the machine's network (a sandbox's egress proxy may answer 404, a plain
host times out or finds no route); the run probes one pod IP and prints what
it answered. What reads cost is measured apart with the operator's reader
(controller/speed.py): one round of N reads against a real gateway's `/speed`
on loopback, and one round of N reads against gateways that accept and never
answer (each read waits out its 2 s timeout), with the event loop's worst
stall meanwhile (the reconcile passes share that loop).

The operator's memory at scale (`--memory NODES`; full runs: 10 000): the
cluster of benchmarks/planner.py (NODES nodes with NFD labels, images and
managedFields, NODES/2 converged models with their pods, claims, ConfigMaps
and Services, two DaemonSet pods per node), generated in this process and
written as the API would send it, is fed in a fresh process to what the
operator keeps of each watched object (`watched.WATCHED`) and to the
operator's pass (`observe` + `plan.plan_pass`, cold, then steady): resident
memory (VmRSS, VmHWM) after the imports, with the watches' objects (and
by kind, as each kind is fed), and after the passes. Recorded objects, not a
kwok cluster of that size (kwok at 10k nodes does not fit this machine).

The operator's pass on the same objects (with `--memory`; another fresh
process): the watches' indexes as kopf keeps them (uid -> kept object), read by
`Reconciler.reconcile_once` (what the running operator calls on each trigger:
snapshot, observe, plan, writes) against a stand-in API server whose status
writes show in the LocalModels' index as their watch events would. CPU seconds
of a cold pass, the passes until nothing is left to write, five quiet passes
(nothing changed), a pass after one node's label change (a node a model runs
on), and three quiet passes after it.

The control plane is sized like a real large cluster: the controller manager's
and the scheduler's API clients get the QPS and burst Kubernetes' own
5,000-node scalability runs set (`LARGE_CLUSTER_RATES` in
tests/harness/cluster.py: 100/100 each; the defaults, 20/30 and 50/100, make
volume binding of a thousand claims wait on the controller manager's client
rather than on the operator). `--default-rates` measures with the defaults.

kwok renews every fake node's Lease with a worker of its own, as each real
kubelet renews its own (`kwok_configuration` in tests/harness/cluster.py; with
kwok's default of 4 workers for all nodes, 1 000 nodes fell behind on a loaded
machine and the node lifecycle controller tainted healthy nodes unreachable).
While the models converge, the run samples the test cluster every 5 s: how far
behind the nodes' lease renewals are, how many nodes are NotReady or tainted;
and from the API server's metrics the mean time of a lease renewal, and its
429 answers: a number is the operator's only while the cluster held.

What the operator does by itself is reported next to time to Ready: time to
every pod made (the operator's part; binding is the scheduler's and the volume
binder's, Ready is kwok's), its CPU seconds (user + system, /proc), the passes
it ran and their total time (its own metrics), its resident memory at the
end (VmRSS, VmHWM), and the leader Leases it lost
(`localmodel_operator_leases_lost_total`: the Lease renews on a thread of its
own, so a pass holding the loop must not cost one).

Needs the binaries of hack/build-tools.sh. Reports the machine's load average
before and after each size: the cluster and the operator share its CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[1] / "operator")]

from tests.builders import MakeLocalModel  # noqa: E402
from tests.harness import TestCluster, locate_tools  # noqa: E402
from tests.harness.cluster import LARGE_CLUSTER_RATES  # noqa: E402
from tests.harness.kubeapi import ApiError, KubeApi  # noqa: E402
from tests.harness.loopwatch import loop_stall_watch  # noqa: E402
from tests.harness.operator import OperatorProcess, install_operator  # noqa: E402
from tests.harness.processes import wait_until  # noqa: E402

READ = {"get", "list", "watch"}
WRITE = {"create", "update", "patch", "delete", "deletecollection"}


def fixture(n: int, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "storageClass": "local-disk",
        "pools": [{"name": "node", "count": n, "cpu": "8", "memory": "32Gi",
                   "labels": {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"},
                   "volumes": ["50Gi"]}],
    }))
    return path


def models(n: int, ns: str) -> list[dict[str, Any]]:
    base = MakeLocalModel("m", ns).spec(model="qwen3:0.6b", cpu=4, context=4096,
                                        storage={"size": "5Gi"})
    return [base.named(f"m{i:04d}").manifest() for i in range(n)]


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU the operator process has used (from /proc)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _metric_sum(text: str, name: str) -> float:
    """A metric summed over its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


READS = "localmodel_operator_gateway_reads_total"
READ_BYTES = "localmodel_operator_gateway_read_bytes_total"


def _by_result(text: str) -> dict[str, float]:
    """localmodel_operator_gateway_reads_total by its `result` label."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(READS + r'\{result="([^"]*)"\} (\S+)$', line)
        if m:
            out[m[1]] = float(m[2])
    return out


def read_cost(n: int, silent: bool = False) -> dict[str, Any]:
    """One round of `n` speed reads by the operator's reader (controller/speed.py)
    on loopback: against a real gateway's GET /speed, or (`silent`) against
    gateways that accept and never answer, as an unreachable replica's would
    not. Wall and CPU seconds, reads by result, and the event loop's worst stall
    while the round ran (the operator's passes run on the same loop)."""
    from localmodel.controller.speed import (
        READ_CONCURRENCY,
        READ_TIMEOUT_SECONDS,
        RESULTS,
        ReadCounters,
        SpeedBook,
        SpeedReader,
        SpeedTarget,
    )
    from localmodel.gateway.server import start_gateway
    from localmodel.gateway_contract import GatewayConfig
    from localmodel.speed import PeerKey

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the operator's reader gives up and closes
        writer.close()

    async def measure() -> dict[str, Any]:
        gw = await start_gateway(GatewayConfig(listen_host="127.0.0.1", listen_port=0,
                                               calibrate_tokens=0), lambda line: None)
        quiet = await asyncio.start_server(never_answer, "127.0.0.2", gw.admin_port,
                                           backlog=4096)

        try:
            book = SpeedBook()
            key = PeerKey("m", "img", 1, None)
            ip = "127.0.0.2" if silent else "127.0.0.1"
            book.retarget([SpeedTarget("bench/m", i, "n", f"m-{i}", f"u{i}", ip, key)
                           for i in range(n)])
            counters = ReadCounters()
            reader = SpeedReader(book, counters, lambda: None, port=gw.admin_port)
            async with loop_stall_watch() as stall, reader.session():
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.monotonic()
                await reader.read_due()
                wall = time.monotonic() - t0
                cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            quiet.close()
            await gw.stop()
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        return {"n": n, "silent": silent,
                "reads": counters.reads.value(("ok",)),
                "by_result": {r: counters.reads.value((r,)) for r in RESULTS
                              if counters.reads.value((r,))},
                "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                "bytes": counters.read_bytes.value(),
                "bound_s": -(-n // READ_CONCURRENCY) * READ_TIMEOUT_SECONDS,
                "loop_stall_s": round(stall.worst, 3)}

    return asyncio.run(measure())


def probe_pod_ip(ip: str, port: int = 8090) -> str:
    """What one kwok pod's IP answers from this machine (kwok runs no gateway there)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/speed", timeout=2) as resp:
            return f"HTTP {resp.status} (server: {resp.headers.get('server', '?')})"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} (server: {exc.headers.get('server', '?')})"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer: {type(reason).__name__} {reason}"


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
LEASE_PUT = 'resource="leases",scope="resource",subresource="",verb="PUT"'
UNHEALTHY_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def _when(stamp: str) -> datetime:
    """An API MicroTime or Time (`2026-12-02T04:31:36.123456Z`) as an aware datetime."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def lease_put_stats(metrics: str) -> dict[str, float]:
    """The API server's own count and total seconds of node lease renewals (PUT
    leases), and how many took over 1 s, from its /metrics text."""
    out = {"count": 0.0, "sum": 0.0, "over_1s": 0.0}
    le_1 = 0.0
    for line in metrics.splitlines():
        if LEASE_PUT not in line or not line.startswith("apiserver_request_duration_seconds"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("apiserver_request_duration_seconds_count"):
            out["count"] += value
        elif line.startswith("apiserver_request_duration_seconds_sum"):
            out["sum"] += value
        elif 'le="1"' in line:
            le_1 += value
    out["over_1s"] = out["count"] - le_1
    return out


def throttled(metrics: str) -> float:
    """Requests the API server answered 429 (apiserver_request_total{code="429"})."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("apiserver_request_total{") and 'code="429"' in line)


class NodeHealthWatch:
    """Samples, every `every` seconds until stopped, how far behind the fake
    nodes' lease renewals are (now - renewTime; kwok renews each every 10 s, the
    node lifecycle controller calls a node NotReady after 50 s without one) and
    how many nodes are NotReady or tainted unreachable/not-ready: the test
    cluster holding up, or not, while the operator converges."""

    def __init__(self, cluster: TestCluster, every: float = 5.0) -> None:
        self.api = cluster.api()
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-health", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> NodeHealthWatch:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def sample(self) -> dict[str, float]:
        now = datetime.now(UTC)
        lags = sorted((now - _when(lease["spec"]["renewTime"])).total_seconds()
                      for lease in _get(self.api, LEASES)["items"]
                      if (lease.get("spec") or {}).get("renewTime"))
        nodes = _get(self.api, "/api/v1/nodes")["items"]
        not_ready = sum(1 for node in nodes for c in
                        (node.get("status") or {}).get("conditions") or []
                        if c.get("type") == "Ready" and c.get("status") != "True")
        tainted = sum(1 for node in nodes if any(
            t.get("key") in UNHEALTHY_TAINTS for t in (node.get("spec") or {}).get("taints") or []))
        return {"t": round(time.monotonic() - self._t0, 1),
                "lease_lag_p50_s": round(lags[len(lags) // 2], 1) if lags else 0.0,
                "lease_lag_max_s": round(lags[-1], 1) if lags else 0.0,
                "not_ready": not_ready, "tainted": tainted,
                "load1": round(os.getloadavg()[0], 2)}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # a slow API server: note it, keep sampling
                print(f"node health sample failed: {exc}", file=sys.stderr)
            if os.environ.get("CONVERGE_DEBUG") and self.samples:
                print(f"node health {self.samples[-1]}", file=sys.stderr)
            self._stop.wait(self.every)

    def summary(self) -> dict[str, Any]:
        worst = {k: max((s[k] for s in self.samples), default=0.0)
                 for k in ("lease_lag_max_s", "not_ready", "tainted", "load1")}
        return {"health_samples": len(self.samples),
                "lease_lag_max_s": worst["lease_lag_max_s"],
                "lease_lag_p50_max_s": max((s["lease_lag_p50_s"] for s in self.samples),
                                           default=0.0),
                "nodes_not_ready_max": int(worst["not_ready"]),
                "nodes_tainted_max": int(worst["tainted"]),
                "load1_max": worst["load1"],
                "load1_mean": round(sum(s["load1"] for s in self.samples)
                                    / max(1, len(self.samples)), 2)}


def _memory_mib(pid: int | None) -> dict[str, float]:
    """The operator's resident memory now and at its peak (VmRSS, VmHWM)."""
    if pid is None:
        return {}
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {f"operator_{k.lower()}_mib": round(int(fields[k].split()[0]) / 1024, 1)
            for k in ("VmRSS", "VmHWM") if k in fields}


def _get(api: KubeApi, path: str) -> dict[str, Any]:
    """GET with a minute's patience: at 1 000 models on this machine a list can take
    longer than KubeApi's 10 s."""
    status, body = api.request("GET", path, timeout=60)
    if status >= 400:
        raise ApiError("GET", path, status, body)
    return body


def _create(api: KubeApi, path: str, body: dict[str, Any], tries: int = 5) -> None:
    """POST with a minute's patience, again after a timeout (a create of 1 000
    took over KubeApi's 10 s at load 15 and ended the run of 2026-12-04 00:47);
    409 after a timed-out try: the first one landed."""
    for attempt in range(tries):
        try:
            status, answer = api.request("POST", path, body, timeout=60)
        except (OSError, http.client.HTTPException):
            if attempt == tries - 1:
                raise
            continue
        if status == 409 and attempt > 0:
            return
        if status >= 400:
            raise ApiError("POST", path, status, answer)
        return


def _apiserver_metrics(cluster: TestCluster) -> str:
    status, body = cluster.api().request("GET", "/metrics", timeout=60)
    return str(body.get("message", "")) if status == 200 else ""


def _metrics_of(op: OperatorProcess, wait: float = 60.0) -> str:
    """The operator's metrics page; its event loop may be in a pass for longer
    than one read's timeout (seconds at 1 000 models on a loaded machine)."""
    deadline = time.monotonic() + wait
    while not (text := op.metrics()) and time.monotonic() < deadline:
        time.sleep(1)
    return text


def run_size(n: int, timeout: float, idle: float = 60.0, large_rates: bool = True
             ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        load_before = os.getloadavg()[0]
        cluster = TestCluster(fixture=fixture(n, Path(tmp) / "nodes.yaml"),
                              tools=locate_tools(), audit=True,
                              client_rates=LARGE_CLUSTER_RATES if large_rates else None)
        began = time.monotonic()
        cluster.start(timeout=600)
        install_operator(cluster)
        # Bare metal: the local disks are the default class (claims name none).
        cluster.kubectl("annotate", "storageclass", "local-disk",
                        "storageclass.kubernetes.io/is-default-class=true")
        # The node lifecycle controller removes the `not-ready` taint a little
        # after kwok reports a node Ready: start the clock on a ready cluster.
        def untainted() -> bool:
            nodes = cluster.api().get("/api/v1/nodes")["items"]
            return len(nodes) == n and not any(
                t.get("key") == "node.kubernetes.io/not-ready"
                for node in nodes for t in (node.get("spec") or {}).get("taints") or [])

        wait_until("every node without the not-ready taint", untainted, timeout=300)
        op = OperatorProcess(cluster, identity="bench")
        op.start()
        setup = time.monotonic() - began
        health = NodeHealthWatch(cluster)
        try:
            api = cluster.api()
            api.create("/api/v1/namespaces", {"metadata": {"name": "bench"}})
            audit_start = len(cluster.audit_events())
            metrics_before = _apiserver_metrics(cluster)
            health.__enter__()
            # Each look lists every LocalModel and pod: at 1 000 of each a look
            # every 0.5 s would take much of a core of this 2-core machine from
            # the cluster it measures. The marks are as fine as the looks.
            poll = max(0.5, n / 500)
            t0 = time.monotonic()
            # Created through the API, 8 at a time: the clock measures the
            # operator and the cluster, not kubectl.
            path = "/apis/localmodel.dev/v1alpha1/namespaces/bench/localmodels"
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda m: _create(api, path, m), models(n, "bench")))
            applied = time.monotonic() - t0
            ready = 0
            marks: dict[str, float] = {}
            while time.monotonic() - t0 < timeout:
                try:  # an API server this loaded may take over 10 s to list them
                    items = _get(api, path)
                    pods = _get(api, "/api/v1/namespaces/bench/pods")["items"]
                except (OSError, ApiError, http.client.HTTPException) as exc:
                    # (an API server this loaded may also cut a long list short:
                    # IncompleteRead, which ended the 1 000 run of 2026-12-04 00:31)
                    print(f"converge: a look failed ({exc!r}); looking again", file=sys.stderr)
                    time.sleep(poll)
                    continue
                ready = sum(1 for lm in items["items"] for c in
                            (lm.get("status") or {}).get("conditions") or []
                            if c.get("type") == "Ready" and c.get("status") == "True")
                stages = {
                    "pods_created": len(pods),
                    "pods_bound": sum(1 for p in pods if p["spec"].get("nodeName")),
                    "pods_ready": sum(1 for p in pods for c in
                                      (p.get("status") or {}).get("conditions") or []
                                      if c["type"] == "Ready" and c["status"] == "True"),
                }
                for stage, count in stages.items():
                    if count >= n and stage not in marks:
                        marks[stage] = round(time.monotonic() - t0, 1)
                if ready == n:
                    break
                time.sleep(poll)
            seconds = time.monotonic() - t0
            health.__exit__()
            metrics_after = _apiserver_metrics(cluster)
            leases = {k: v - lease_put_stats(metrics_before)[k]
                      for k, v in lease_put_stats(metrics_after).items()}
            kwok_log = next(p.log_path for p in cluster.processes if p.name == "kwok")
            lease_failures = kwok_log.read_text(errors="replace").count("Failed to sync lease")
            time.sleep(3)  # the last status writes and events
            events = cluster.audit_events()[audit_start:]
            metrics = _metrics_of(op)
            cpu_ready = _cpu_seconds(op.proc.pid if op.proc else None)
            reads_ready = _by_result(metrics)
            bytes_ready = _metric(metrics, READ_BYTES)
            pod_ips = [p["status"]["podIP"] for p in api.get(
                "/api/v1/namespaces/bench/pods")["items"] if p.get("status", {}).get("podIP")]
            pod_ip_answer = probe_pod_ip(pod_ips[0]) if pod_ips else "no pod IP"
            time.sleep(idle)  # no traffic: the idle window
            after_idle = _metrics_of(op)
            reads_idle = {r: v - reads_ready.get(r, 0.0)
                          for r, v in _by_result(after_idle).items()
                          if v - reads_ready.get(r, 0.0)}
            all_events = api.get("/api/v1/namespaces/bench/events")["items"]
            event_reasons = Counter(e.get("reason", "") for e in all_events)
            warnings: dict[str, list[str]] = {}  # two of each kind of Warning Event
            for e in all_events:
                if e.get("type") == "Warning":
                    who = (e.get("source") or {}).get("component") or e.get("reportingComponent")
                    seen = warnings.setdefault(f"{e.get('reason')} ({who})", [])
                    if len(seen) < 2:
                        seen.append(f"{e['involvedObject'].get('name')}: "
                                    f"{e.get('message', '')[:240]}")
            for e in all_events:
                if e.get("reason") in ("Unplaced", "Moved") and os.environ.get("CONVERGE_DEBUG"):
                    print(e["involvedObject"]["name"], e["reason"], e["message"][:300],
                          file=sys.stderr)
            operator_cpu = _cpu_seconds(op.proc.pid if op.proc else None)
            memory = _memory_mib(op.proc.pid if op.proc else None)
        finally:
            health.__exit__()
            op.stop()
            cluster.stop()
        verbs = Counter(e["verb"] for e in events)
        writes = Counter(f"{e['verb']} {e['objectRef'].get('resource')}"
                         for e in events if e["verb"] in WRITE)
        return {
            "n": n,
            "ready": ready,
            "seconds_to_ready": round(seconds, 1),
            "create_seconds": round(applied, 1),
            **{f"all_{k}_s": v for k, v in marks.items()},
            "setup_seconds": round(setup, 1),
            "reads_per_model": round(sum(verbs[v] for v in READ) / n, 2),
            "writes_per_model": round(sum(verbs[v] for v in WRITE) / n, 2),
            "writes": dict(sorted(writes.items())),
            "operator_cpu_s": operator_cpu,
            "operator_cpu_to_ready_s": cpu_ready,
            **memory,
            "client_rates": "large" if large_rates else "default",
            "events_by_reason": dict(sorted(event_reasons.items())),
            "warning_samples": warnings,
            "speed_reads_to_ready": sum(reads_ready.values()),
            "speed_reads_to_ready_by_result": reads_ready,
            "speed_read_bytes_to_ready": bytes_ready,
            "speed_reads_idle": sum(reads_idle.values()),
            "speed_reads_idle_by_result": reads_idle,
            "speed_read_bytes_idle": _metric(after_idle, READ_BYTES) - bytes_ready,
            "pod_ip_answer": pod_ip_answer,
            "idle_seconds": idle,
            "passes": _metric(metrics, "localmodel_operator_pass_duration_seconds_count"),
            # Passes cut short because the operator lost its own leader Lease.
            "passes_aborted": _metric(
                metrics, 'localmodel_operator_passes_total{result="aborted"}'),
            # Times the operator stopped leading other than by a release (its
            # Lease renews on a thread of its own, controller/leader.py).
            "leases_lost": _metric_sum(metrics, "localmodel_operator_leases_lost_total"),
            "pass_seconds_total": round(
                _metric(metrics, "localmodel_operator_pass_duration_seconds_sum"), 2),
            **health.summary(),
            "kwok_lease_failures": lease_failures,
            "lease_renewals": int(leases["count"]),
            "lease_put_mean_ms": round(1000 * leases["sum"] / max(1.0, leases["count"]), 1),
            "lease_puts_over_1s": int(leases["over_1s"]),
            "apiserver_429": int(throttled(metrics_after) - throttled(metrics_before)),
            "poll_s": poll,
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }


def _status_mib() -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in
                  Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}


def memory_child(path: Path) -> dict[str, Any]:
    """In a fresh process: the watched objects of `path` (JSON lines of
    [watch name, body]) kept as the operator's watches keep them, then its
    passes; resident memory at each step (see the module's docstring)."""
    from benchmarks.planner import NOW, OPTIONS
    from localmodel.controller.parse_memo import Parsed
    from localmodel.controller.plan import plan_pass
    from localmodel.controller.reconcile import gc_paused
    from localmodel.controller.snapshot import Snapshot, observe
    from localmodel.controller.watched import WATCHED
    from localmodel.incremental import Desired

    rows = {w.name: w for w in WATCHED}
    gc.collect()
    base = _status_mib()
    stores: dict[str, list[Any]] = {name: [] for name in rows}
    per_kind: dict[str, float] = {}  # the file holds one kind after another
    last, before = "", base["VmRSS"]

    def kind_done() -> None:
        nonlocal before
        if last:
            gc.collect()
            now = _status_mib()["VmRSS"]
            per_kind[last], before = round(now - before, 1), now

    with path.open() as f:
        for line in f:
            name, body = json.loads(line)
            if name != last:
                kind_done()
                last = name
            if rows[name].selected(body):
                stores[name].append(rows[name].keep(body))
    kind_done()
    snap = Snapshot(**stores)
    gc.collect()
    held = _status_mib()
    parsed, desired = Parsed(), Desired()
    placed: dict[str, dict[int, str]] = {}

    def one_pass() -> tuple[float, int]:
        nonlocal placed
        t0 = time.process_time()
        with gc_paused():
            obs = observe(snap, (), parsed)
            out = plan_pass(obs, NOW, OPTIONS, placed=placed, avoid={}, desired=desired)
        placed = out.placed
        return time.process_time() - t0, sum(len(w.changes.changes) for w in out.work)

    cold_s, _ = one_pass()
    gc.collect()
    cold = _status_mib()
    steady_s, steady_writes = one_pass()
    gc.collect()
    steady = _status_mib()
    return {
        "counts": {k: len(v) for k, v in stores.items()},
        "imports_rss_mib": base["VmRSS"],
        "watches_mib": round(held["VmRSS"] - base["VmRSS"], 1),
        "watches_mib_by_kind": per_kind,
        "after_cold_pass_rss_mib": cold["VmRSS"],
        "pass_state_mib": round(cold["VmRSS"] - held["VmRSS"], 1),
        "after_steady_pass_rss_mib": steady["VmRSS"],
        "peak_rss_mib": steady["VmHWM"],
        "cold_pass_cpu_s": round(cold_s, 2),
        "steady_pass_cpu_s": round(steady_s, 2),
        "steady_writes": steady_writes,
    }


def memory_at(n: int) -> dict[str, Any]:
    """The operator's resident memory at `n` nodes and n/2 models (docstring)."""
    from benchmarks.planner import watched_bodies

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "watched.jsonl"
        t0 = time.monotonic()
        _, bodies = watched_bodies(n)
        with path.open("w") as f:
            for name, items in bodies.items():
                for body in items:
                    f.write(json.dumps([name, body]) + "\n")
        size = path.stat().st_size
        del bodies
        generated = time.monotonic() - t0
        done = subprocess.run([sys.executable, __file__, "--memory-child", str(path)],
                              capture_output=True, text=True, check=False, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"converge.py --memory-child exited {done.returncode}:\n"
                         f"{done.stderr[-4000:]}")
    return {"nodes": n, "models": n // 2, "api_json_mib": round(size / 2**20, 1),
            "generate_s": round(generated, 1),
            **json.loads(done.stdout.strip().splitlines()[-1])}


class _Indexes:
    """The watches' in-memory indexes as kopf keeps them (per watch: uid -> what
    `watched.WATCHED` keeps), and a stand-in for the API server's writes: a
    status the reconciler writes shows in the LocalModels' index as its watch
    event would (a new object, a new resourceVersion); other writes are counted.
    The reconciler reads the indexes through `sources`, as handlers.py wires them."""

    def __init__(self, path: Path) -> None:
        from localmodel.controller.watched import WATCHED

        rows = {w.name: w for w in WATCHED}
        self.stores: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in rows}
        with path.open() as f:
            for i, line in enumerate(f):
                name, body = json.loads(line)
                if rows[name].selected(body):
                    uid = str(body["metadata"].get("uid") or i)
                    self.stores[name][uid] = rows[name].keep(body)
        self.by_name = {(b["metadata"]["namespace"], b["metadata"]["name"]): uid
                        for uid, b in self.stores["localmodels"].items()}
        self.writes = 0
        self.rv = 10**8

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        return manifest

    async def apply(self, manifest: dict[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        self.writes += 1
        if subresource == "status":
            meta = manifest["metadata"]
            uid = self.by_name[(meta["namespace"], meta["name"])]
            old = self.stores["localmodels"][uid]
            self.rv += 1
            self.stores["localmodels"][uid] = {
                **old, "status": manifest["status"],
                "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        return manifest

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        self.writes += 1

    def relabel_one_node(self, name: str) -> None:
        """One node's label changed: its watch event replaces the kept object."""
        uid, body = next((u, b) for u, b in self.stores["nodes"].items()
                         if b["metadata"]["name"] == name)
        labels = dict(body["metadata"].get("labels") or {})
        labels["topology.kubernetes.io/zone"] = labels.get("topology.kubernetes.io/zone",
                                                           "") + "-b"
        self.rv += 1
        self.stores["nodes"][uid] = {**body, "metadata": {
            **body["metadata"], "labels": labels, "resourceVersion": str(self.rv)}}


def pass_child(path: Path) -> dict[str, Any]:
    """In a fresh process: the reconciler's pass (`Reconciler.reconcile_once`,
    what the running operator calls on each trigger: snapshot, observe, plan,
    the writes) on the watched objects of `path` (`_Indexes`): cold, again until
    no write is left, then quiet passes (nothing changed), a pass after one
    node's label change (a node a model runs on), quiet passes, then four more
    label changes of other such nodes, a pass each; CPU seconds of each."""
    from benchmarks.planner import OPTIONS
    from localmodel.contract import LABEL_NAME
    from localmodel.controller.config import OperatorConfig
    from localmodel.controller.operator_metrics import OperatorMetrics
    from localmodel.controller.reconcile import Reconciler

    indexes = _Indexes(path)
    rec = Reconciler(OperatorConfig(operator_image=OPTIONS.operator_image), indexes,  # type: ignore[arg-type]
                     OperatorMetrics())
    for name, store in indexes.stores.items():
        rec.sources[name] = store.values

    async def one() -> tuple[float, int]:
        writes, t0 = indexes.writes, time.process_time()
        await rec.reconcile_once()
        return time.process_time() - t0, indexes.writes - writes

    async def run() -> dict[str, Any]:
        cold_s, cold_writes = await one()
        settle: list[tuple[float, int]] = []
        while len(settle) < 5 and (not settle or settle[-1][1]):
            settle.append(await one())
        quiet = [await one() for _ in range(5)]
        nodes = list(dict.fromkeys(b["spec"]["nodeName"] for b in indexes.stores["pods"].values()
                                   if (b["metadata"].get("labels") or {}).get(LABEL_NAME)))
        indexes.relabel_one_node(nodes[0])
        label_s, label_writes = await one()
        after = [await one() for _ in range(3)]
        more = []  # then one more node's label change at a time, each a node models run on
        for node in nodes[1:][::max(1, len(nodes) // 5)][:4]:
            indexes.relabel_one_node(node)
            more.append(await one())
        return {"cold_pass_cpu_s": round(cold_s, 2), "cold_writes": cold_writes,
                "settle_passes": [[round(s, 3), w] for s, w in settle],
                "quiet_pass_cpu_ms": [round(s * 1000, 1) for s, _ in quiet],
                "quiet_writes": sum(w for _, w in quiet),
                "label_pass_cpu_ms": round(label_s * 1000, 1), "label_writes": label_writes,
                "after_label_quiet_ms": [round(s * 1000, 1) for s, _ in after],
                "more_label_passes_ms": [round(s * 1000, 1) for s, _ in more],
                "more_label_writes": sum(w for _, w in more)}

    return asyncio.run(run())


def passes_at(n: int) -> dict[str, Any]:
    """The reconciler's pass CPU at `n` nodes and n/2 models (`pass_child`)."""
    from benchmarks.planner import watched_bodies

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "watched.jsonl"
        _, bodies = watched_bodies(n)
        with path.open("w") as f:
            for name, items in bodies.items():
                for body in items:
                    f.write(json.dumps([name, body]) + "\n")
        del bodies
        done = subprocess.run([sys.executable, __file__, "--pass-child", str(path)],
                              capture_output=True, text=True, check=False, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"converge.py --pass-child exited {done.returncode}:\n"
                         f"{done.stderr[-4000:]}")
    return {"nodes": n, "models": n // 2,
            **json.loads(done.stdout.strip().splitlines()[-1])}


def _results(by: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items())) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[50, 100, 300, 1000],
                        help="model counts (kwok nodes as many); none: only --memory")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--idle", type=float, default=60.0,
                        help="seconds of the idle window after all Ready (speed reads)")
    parser.add_argument("--memory", type=int, default=10000, metavar="NODES",
                        help="the operator's memory at NODES nodes, NODES/2 models (0: none)")
    parser.add_argument("--memory-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pass-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="CI: N = 20, a 10 s idle window, memory at 800 nodes")
    parser.add_argument("--default-rates", action="store_true",
                        help="the controller manager's and scheduler's default client rates")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.memory_child is not None:
        print(json.dumps(memory_child(args.memory_child)))
        return 0
    if args.pass_child is not None:
        print(json.dumps(pass_child(args.pass_child)))
        return 0
    if args.quick:
        args.sizes, args.idle, args.memory = [20], 10.0, 800
    rows = []
    for n in args.sizes:
        row = run_size(n, args.timeout, args.idle, large_rates=not args.default_rates)
        rows.append(row)
        print(f"N={n}: {row['ready']}/{n} Ready in {row['seconds_to_ready']} s "
              f"(load {row['load_before']} -> {row['load_after']})", file=sys.stderr)
    out: dict[str, Any] = {"quick": args.quick, "rows": rows}
    if rows:
        print_rows(rows)
        n_cost = 20 if args.quick else max(300, max(args.sizes))
        cost = read_cost(n_cost)
        print(f"a round of {n_cost} speed reads by the operator's reader against a real "
              f"gateway on loopback: {cost['reads']:.0f} ok in {cost['wall_s']} s wall, "
              f"{cost['cpu_s']} s CPU, {cost['bytes']:.0f} bytes; the event loop's worst "
              f"stall {cost['loop_stall_s']} s")
        n_silent = 20 if args.quick else 300
        silent = read_cost(n_silent, silent=True)
        print(f"a round of {n_silent} speed reads against gateways that never answer: "
              f"{_results(silent['by_result'])} in {silent['wall_s']} s wall (bound "
              f"{silent['bound_s']:.0f} s: 16 at a time, 2 s each), {silent['cpu_s']} s CPU; "
              f"the event loop's worst stall {silent['loop_stall_s']} s")
        out |= {"read_cost": cost, "silent_read_cost": silent}
    if args.memory:
        mem = memory_at(args.memory)
        out["memory"] = mem
        print(f"operator memory at {mem['nodes']} nodes, {mem['models']} models (generated "
              f"objects fed in a fresh process; {mem['api_json_mib']} MiB of API JSON): "
              + ", ".join(f"{v} {k}" for k, v in mem["counts"].items()))
        print(f"  resident: imports {mem['imports_rss_mib']} MiB; the watches' objects "
              f"+{mem['watches_mib']} MiB; after a cold pass +{mem['pass_state_mib']} MiB "
              f"({mem['after_cold_pass_rss_mib']} MiB); after a steady pass "
              f"{mem['after_steady_pass_rss_mib']} MiB; peak {mem['peak_rss_mib']} MiB")
        print("  the watches' objects by kind (resident, as each kind was fed): "
              + ", ".join(f"{k} +{v} MiB" for k, v in mem["watches_mib_by_kind"].items()))
        print(f"  one pass (observe + plan_pass): cold {mem['cold_pass_cpu_s']} s CPU, "
              f"steady {mem['steady_pass_cpu_s']} s CPU ({mem['steady_writes']} writes)")
    if args.memory:
        passes = passes_at(args.memory)
        out["operator_pass"] = passes
        print(f"the operator's pass at {passes['nodes']} nodes, {passes['models']} models "
              "(Reconciler.reconcile_once on the watches' indexes; a status written shows in "
              f"them): cold {passes['cold_pass_cpu_s']} s CPU ({passes['cold_writes']} "
              f"writes), settling {passes['settle_passes']} [s, writes]; quiet "
              f"{passes['quiet_pass_cpu_ms']} ms CPU ({passes['quiet_writes']} writes); after "
              f"one node's label change {passes['label_pass_cpu_ms']} ms "
              f"({passes['label_writes']} writes), then quiet {passes['after_label_quiet_ms']} ms; "
              f"other nodes' label changes {passes['more_label_passes_ms']} ms "
              f"({passes['more_label_writes']} writes)")
    if args.json:
        print(json.dumps(out))
    return 0


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'N':>6} {'ready':>7} {'s to Ready':>11} {'pods made':>10} {'bound':>7} "
          f"{'pods Ready':>11} {'op CPU s':>9} {'to Ready':>9} {'passes':>7} {'pass s':>7} "
          f"{'op RSS':>7} {'reads/model':>12} {'writes/model':>13} "
          f"{'writes/model vs N=' + str(rows[0]['n']):>22} {'load':>12}")
    base = rows[0]["writes_per_model"] or 1
    for r in rows:
        print(f"{r['n']:>6} {r['ready']:>7} {r['seconds_to_ready']:>11.1f} "
              f"{r.get('all_pods_created_s', '-'):>10} {r.get('all_pods_bound_s', '-'):>7} "
              f"{r.get('all_pods_ready_s', '-'):>11} {r['operator_cpu_s']:>9.1f} "
              f"{r['operator_cpu_to_ready_s']:>9.1f} "
              f"{r['passes']:>7.0f} {r['pass_seconds_total']:>7.1f} "
              f"{r.get('operator_vmrss_mib', 0):>6.0f}M {r['reads_per_model']:>12.2f} "
              f"{r['writes_per_model']:>13.2f} {r['writes_per_model'] / base:>22.2f} "
              f"{r['load_before']:>5}->{r['load_after']:<5}")
    print("s to Ready: from the first create to every LocalModel Ready=True; pods made / "
          "bound / Ready: when every pod existed (the operator), was bound (kube-scheduler "
          "and the volume binder) and was Ready (kwok). op CPU s: the operator's CPU "
          "seconds, whole run (idle window included) and to Ready; passes / pass s: its "
          "reconcile passes and their total time (its metrics); op RSS: its resident memory "
          "at the end. reads/writes per model: the operator's API requests (audit log). "
          f"load: 1-minute load average. Client rates: {rows[0]['client_rates']}.")
    for r in rows:
        made = r.get("all_pods_created_s")
        share = (f"every pod made at {made} s of {r['seconds_to_ready']} s to all Ready "
                 f"({100 * made / r['seconds_to_ready']:.0f}%)" if made and r["ready"] == r["n"]
                 else f"pods made: {made if made else 'not all'}")
        print(f"the operator's share at N={r['n']}: {share}; {r['operator_cpu_to_ready_s']} "
              f"CPU s to Ready; {r['writes_per_model']} writes per model; "
              f"{r['leases_lost']:.0f} leases lost, {r['passes_aborted']:.0f} passes aborted")
    print("writes by verb and resource (last N): " + ", ".join(
        f"{k}={v}" for k, v in rows[-1]["writes"].items()))
    print("Events by reason (last N): " + ", ".join(
        f"{k}={v}" for k, v in rows[-1]["events_by_reason"].items()))
    for reason, samples in rows[-1]["warning_samples"].items():
        for sample in samples:
            print(f"  Warning {reason}: {sample}")
    print(f"{'N':>6} {'lease lag max s':>16} {'nodes NotReady max':>19} "
          f"{'tainted max':>12} {'lease PUT mean ms':>18} {'>1 s':>6} "
          f"{'kwok lease errors':>18} {'429s':>6} {'load mean/max':>14} "
          f"{'passes aborted':>15} {'leases lost':>12}")
    for r in rows:
        print(f"{r['n']:>6} {r['lease_lag_max_s']:>16.1f} {r['nodes_not_ready_max']:>19} "
              f"{r['nodes_tainted_max']:>12} {r['lease_put_mean_ms']:>18.1f} "
              f"{r['lease_puts_over_1s']:>6} {r['kwok_lease_failures']:>18} "
              f"{r['apiserver_429']:>6} {r['load1_mean']:>6}/{r['load1_max']:<7} "
              f"{r['passes_aborted']:>15.0f} {r['leases_lost']:>12.0f}")
    print("The test cluster while converging (sampled every 5 s): how far behind the "
          "fake nodes' lease renewals were (kwok renews every 10 s; 50 s without one "
          "makes a node NotReady), nodes NotReady or tainted unreachable/not-ready at "
          "once, the API server's mean time for a lease renewal (PUT) and those over "
          "1 s, kwok's failed renewals, the API server's 429 answers, 1-minute load; "
          "passes aborted: the operator's passes cut short because it lost its own "
          "leader Lease; leases lost: localmodel_operator_leases_lost_total.")
    print(f"{'N':>6} {'speed reads to Ready, by result':>34} {'per model':>10} "
          f"{'bytes/model':>12} {'reads idle':>11} {'idle s':>7}  what a kwok pod IP answers")
    for r in rows:
        print(f"{r['n']:>6} {_results(r['speed_reads_to_ready_by_result']):>34} "
              f"{r['speed_reads_to_ready'] / r['n']:>10.2f} "
              f"{r['speed_read_bytes_to_ready'] / r['n']:>12.0f} "
              f"{_results(r['speed_reads_idle_by_result']):>11} {r['idle_seconds']:>7.0f}  "
              f"{r['pod_ip_answer']}")


if __name__ == "__main__":
    sys.exit(main())
