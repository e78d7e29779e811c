"""How fast the operator converges, and what it costs the API server, as N grows.

For each N: a fresh real control plane (etcd, kube-apiserver with an audit log,
controller-manager, scheduler, kwok) with N fake nodes (8 CPUs, 32 GiB, one
local disk each), the CRD and the chart's RBAC, `localmodel run` as the
chart's identity; then N exclusive LocalModels are applied at once and the
clock runs until every one is Ready. API requests by the operator's user come
from the audit log. Printed side by side: seconds to all Ready, and reads and
writes per model (writes per model should not depend on N).

    python benchmarks/converge.py                # N = 50, 100, 300, 1000
    python benchmarks/converge.py --sizes 50 100 # a subset
    python benchmarks/converge.py --quick        # CI: N = 20, a 10 s idle window
    python benchmarks/converge.py --json         # one JSON object as the last line

The operator's reads of the gateways' speed (docs/operator.md, Speed) are
counted from its metrics (`localmodel_operator_gateway_reads_total`): once
every model is Ready, and again after an idle window with no traffic (by
default 60 s), which should add none. kwok runs no gateways, so those reads
fail; what a read costs when it succeeds is measured apart: one round of N
reads by the operator's reader against a real gateway's `/speed` on loopback.

The control plane is sized like a real large cluster: the controller manager's
and the scheduler's API clients get the QPS and burst Kubernetes' own
5,000-node scalability runs set (`LARGE_CLUSTER_RATES` in
tests/harness/cluster.py: 100/100 each; the defaults, 20/30 and 50/100, make
volume binding of a thousand claims wait on the controller manager's client
rather than on the operator). `--default-rates` measures with the defaults.

What the operator does by itself is reported next to time to Ready: time to
every pod made (the operator's part; binding is the scheduler's and the volume
binder's, Ready is kwok's), its CPU seconds (user + system, /proc), the passes
it ran and their total time (its own metrics), and its resident memory at the
end (VmRSS, VmHWM).

Needs the binaries of hack/build-tools.sh. Reports the machine's load average
before and after each size: the cluster and the operator share its CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[1] / "operator")]

from tests.harness import TestCluster, locate_tools  # noqa: E402
from tests.harness.cluster import LARGE_CLUSTER_RATES  # noqa: E402
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
    return [{"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
             "metadata": {"name": f"m{i:04d}", "namespace": ns},
             "spec": {"model": "qwen3:0.6b", "cpu": 4, "context": 4096,
                      "storage": {"size": "5Gi"}}} for i in range(n)]


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
               if line.startswith(name + " ") or line.startswith(name + "{"))


READS = "localmodel_operator_gateway_reads_total"


def read_cost(n: int) -> dict[str, float]:
    """One round of `n` speed reads by the operator's reader (controller/speed.py)
    against a real gateway's GET /speed on loopback: wall and CPU seconds."""
    import asyncio
    import resource

    from localmodel.controller.speed import ReadCounters, SpeedBook, SpeedReader, SpeedTarget
    from localmodel.gateway.config import GatewayConfig
    from localmodel.gateway.server import start_gateway
    from localmodel.speed import PeerKey

    async def measure() -> dict[str, float]:
        gw = await start_gateway(GatewayConfig(listen_host="127.0.0.1", listen_port=0,
                                               calibrate_tokens=0), lambda line: None)
        try:
            book = SpeedBook()
            key = PeerKey("m", "img", 1, None)
            book.retarget([SpeedTarget("bench/m", i, "n", f"m-{i}", f"u{i}", "127.0.0.1", key)
                           for i in range(n)])
            counters = ReadCounters()
            reader = SpeedReader(book, counters, lambda: None, port=gw.port)
            async with reader.session():
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.monotonic()
                await reader.read_due()
                wall = time.monotonic() - t0
                cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            await gw.stop()
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        return {"reads": counters.reads.value(("ok",)), "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3), "bytes": counters.read_bytes.value()}

    return asyncio.run(measure())


def _memory_mib(pid: int | None) -> dict[str, float]:
    """The operator's resident memory now and at its peak (VmRSS, VmHWM)."""
    if pid is None:
        return {}
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {f"operator_{k.lower()}_mib": round(int(fields[k].split()[0]) / 1024, 1)
            for k in ("VmRSS", "VmHWM") if k in fields}


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
        try:
            api = cluster.api()
            api.create("/api/v1/namespaces", {"metadata": {"name": "bench"}})
            audit_start = len(cluster.audit_events())
            t0 = time.monotonic()
            # Created through the API, 8 at a time: the clock measures the
            # operator and the cluster, not kubectl.
            path = "/apis/localmodel.dev/v1alpha1/namespaces/bench/localmodels"
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda m: api.create(path, m), models(n, "bench")))
            applied = time.monotonic() - t0
            ready = 0
            marks: dict[str, float] = {}
            while time.monotonic() - t0 < timeout:
                items = api.get(path)
                ready = sum(1 for lm in items["items"] for c in
                            (lm.get("status") or {}).get("conditions") or []
                            if c.get("type") == "Ready" and c.get("status") == "True")
                pods = api.get("/api/v1/namespaces/bench/pods")["items"]
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
                time.sleep(0.5)
            seconds = time.monotonic() - t0
            time.sleep(3)  # the last status writes and events
            events = cluster.audit_events()[audit_start:]
            metrics = op.metrics()
            reads_ready = _metric_sum(metrics, READS)
            time.sleep(idle)  # no traffic: the idle window
            reads_idle = _metric_sum(op.metrics(), READS) - reads_ready
            all_events = api.get("/api/v1/namespaces/bench/events")["items"]
            event_reasons = Counter(e.get("reason", "") for e in all_events)
            for e in all_events:
                if e.get("reason") in ("Unplaced", "Moved") and os.environ.get("CONVERGE_DEBUG"):
                    print(e["involvedObject"]["name"], e["reason"], e["message"][:300],
                          file=sys.stderr)
            operator_cpu = _cpu_seconds(op.proc.pid if op.proc else None)
            memory = _memory_mib(op.proc.pid if op.proc else None)
        finally:
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
            **memory,
            "client_rates": "large" if large_rates else "default",
            "events_by_reason": dict(sorted(event_reasons.items())),
            "speed_reads_to_ready": reads_ready,
            "speed_reads_idle": reads_idle,
            "idle_seconds": idle,
            "passes": _metric(metrics, "localmodel_operator_pass_duration_seconds_count"),
            "pass_seconds_total": round(
                _metric(metrics, "localmodel_operator_pass_duration_seconds_sum"), 2),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 300, 1000])
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--idle", type=float, default=60.0,
                        help="seconds of the idle window after all Ready (speed reads)")
    parser.add_argument("--quick", action="store_true", help="CI: N = 20, a 10 s idle window")
    parser.add_argument("--default-rates", action="store_true",
                        help="the controller manager's and scheduler's default client rates")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.idle = [20], 10.0
    rows = []
    for n in args.sizes:
        row = run_size(n, args.timeout, args.idle, large_rates=not args.default_rates)
        rows.append(row)
        print(f"N={n}: {row['ready']}/{n} Ready in {row['seconds_to_ready']} s "
              f"(load {row['load_before']} -> {row['load_after']})", file=sys.stderr)
    print(f"{'N':>6} {'ready':>7} {'s to Ready':>11} {'pods made':>10} {'bound':>7} "
          f"{'pods Ready':>11} {'op CPU s':>9} {'passes':>7} {'pass s':>7} {'op RSS':>7} "
          f"{'reads/model':>12} {'writes/model':>13} "
          f"{'writes/model vs N=' + str(rows[0]['n']):>22} {'load':>12}")
    base = rows[0]["writes_per_model"] or 1
    for r in rows:
        print(f"{r['n']:>6} {r['ready']:>7} {r['seconds_to_ready']:>11.1f} "
              f"{r.get('all_pods_created_s', '-'):>10} {r.get('all_pods_bound_s', '-'):>7} "
              f"{r.get('all_pods_ready_s', '-'):>11} {r['operator_cpu_s']:>9.1f} "
              f"{r['passes']:>7.0f} {r['pass_seconds_total']:>7.1f} "
              f"{r.get('operator_vmrss_mib', 0):>6.0f}M {r['reads_per_model']:>12.2f} "
              f"{r['writes_per_model']:>13.2f} {r['writes_per_model'] / base:>22.2f} "
              f"{r['load_before']:>5}->{r['load_after']:<5}")
    print("s to Ready: from the first create to every LocalModel Ready=True; pods made / "
          "bound / Ready: when every pod existed (the operator), was bound (kube-scheduler "
          "and the volume binder) and was Ready (kwok). op CPU s: the operator's CPU "
          "seconds (whole run, idle window included); passes / pass s: its reconcile "
          "passes and their total time (its metrics); op RSS: its resident memory at the "
          f"end. load: 1-minute load average. Client rates: {rows[0]['client_rates']}.")
    print("writes by verb and resource (last N): " + ", ".join(
        f"{k}={v}" for k, v in rows[-1]["writes"].items()))
    print(f"{'N':>6} {'speed reads to Ready':>21} {'speed reads idle':>17} {'idle s':>7}")
    for r in rows:
        print(f"{r['n']:>6} {r['speed_reads_to_ready']:>21.0f} {r['speed_reads_idle']:>17.0f} "
              f"{r['idle_seconds']:>7.0f}")
    cost = read_cost(max(300, max(args.sizes)) if not args.quick else 20)
    print(f"speed reads by the operator's reader against a real gateway on loopback: "
          f"{cost['reads']:.0f} reads in {cost['wall_s']} s wall, {cost['cpu_s']} s CPU, "
          f"{cost['bytes']:.0f} bytes")
    if args.json:
        print(json.dumps({"rows": rows, "read_cost": cost}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
