"""How long `plan()` and `desired_state()` take for 1k, 5k and 10k nodes with
half as many models.

Run: python benchmarks/planner.py

Realistic, mixed clusters: four node shapes (4 to 32 CPUs, allocatable a bit
below capacity), three zones, a unique hostname label per node, DaemonSet usage
on every node, 10% of nodes tainted NoSchedule, 5% PreferNoSchedule, 1%
cordoned. Models ask for 1 to 8 CPUs (5% ask for the whole node), 1 to 24 GiB;
80% are exclusive, 20% use a node selector (pool or zone; 1% pin a hostname),
10% tolerate the dedicated taint. One replica each.

Columns: a fresh plan, and a re-plan of its own output (the steady state of
the operator: everything is kept). "per node" is time / nodes, and "vs linear"
divides it by the 1k case: 1.0 means linear growth. Times are this process's
CPU time (best of 5), so other work on a busy machine does not count.

Second table: the whole pass the operator makes, `desired_state()` (demands,
plan, rules per replica, render, status) for LocalModels of the same mix,
side by side with `plan()` of the demands it derives; "x plan" is their ratio
and "vs linear" the desired_state time per model against the 1k case. Best
of 3.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel, Toleration
from localmodel.desired import demand, desired_state
from localmodel.facts import NodeFacts, Taint
from localmodel.planner import ModelDemand, Plan, Usage, plan

GiB = 1 << 30
SHAPES = [  # (pool, instance type, CPUs, memory GiB, weight)
    ("small", "c-4", 4, 16, 4),
    ("general", "m-8", 8, 32, 3),
    ("large", "m-16", 16, 64, 2),
    ("amx", "x-32", 32, 128, 1),
]
DEDICATED = Taint("dedicated", "inference", "NoSchedule")
SPOT = Taint("spot", "true", "PreferNoSchedule")
DEDICATED_OK = Toleration(key="dedicated", value="inference")


def cluster(n: int, rng: random.Random) -> tuple[list[NodeFacts], dict[str, Usage]]:
    nodes, usage = [], {}
    weights = [s[4] for s in SHAPES]
    for i in range(n):
        pool, itype, cpus, mem, _ = rng.choices(SHAPES, weights)[0]
        name = f"node-{i:05d}"
        taints: tuple[Taint, ...] = ()
        roll = rng.random()
        if roll < 0.10:
            taints = (DEDICATED,)
        elif roll < 0.15:
            taints = (SPOT,)
        nodes.append(
            NodeFacts(
                name=name,
                allocatable_cpu_milli=cpus * 1000 - 80,
                allocatable_memory_bytes=mem * GiB - 600 * (1 << 20),
                labels={
                    "kubernetes.io/hostname": name,
                    "node.kubernetes.io/instance-type": itype,
                    "topology.kubernetes.io/zone": f"zone-{i % 3}",
                    "localmodel.dev/pool": pool,
                },
                taints=taints,
                schedulable=rng.random() > 0.01,
            )
        )
        usage[name] = Usage(rng.randrange(100, 500), rng.randrange(200, 800) * (1 << 20))
    return nodes, usage


def models(n: int, nodes: list[NodeFacts], rng: random.Random) -> list[ModelDemand]:
    out = []
    for i in range(n):
        selector: dict[str, str] = {}
        roll = rng.random()
        if roll < 0.01:
            selector = {"kubernetes.io/hostname": rng.choice(nodes).name}
        elif roll < 0.12:
            selector = {"localmodel.dev/pool": rng.choice(SHAPES)[0]}
        elif roll < 0.20:
            selector = {"topology.kubernetes.io/zone": f"zone-{rng.randrange(3)}"}
        tolerations = (DEDICATED_OK,) if rng.random() < 0.1 else ()
        out.append(
            ModelDemand(
                key=f"ns-{i % 50}/model-{i:05d}",
                replicas=1,
                cpu=None if rng.random() < 0.05 else rng.choice([1, 2, 2, 4, 4, 8]),
                memory_bytes=rng.randrange(1, 24) * GiB,
                exclusive=rng.random() < 0.8,
                node_selector=selector,
                tolerations=tolerations,
                overhead_cpu_milli=100 if rng.random() < 0.9 else 0,
            )
        )
    return out


def local_models(n: int, nodes: list[NodeFacts], rng: random.Random) -> list[LocalModel]:
    """LocalModels of the same mix as ``models`` (the gateway is the overhead)."""
    out = []
    for i in range(n):
        placement: dict[str, Any] = {"exclusive": rng.random() < 0.8}
        roll = rng.random()
        if roll < 0.01:
            placement["nodeSelector"] = {"kubernetes.io/hostname": rng.choice(nodes).name}
        elif roll < 0.12:
            placement["nodeSelector"] = {"localmodel.dev/pool": rng.choice(SHAPES)[0]}
        elif roll < 0.20:
            placement["nodeSelector"] = {"topology.kubernetes.io/zone": f"zone-{rng.randrange(3)}"}
        if rng.random() < 0.1:
            placement["tolerations"] = [{"key": "dedicated", "value": "inference"}]
        spec = {
            "model": "qwen3:1.7b",
            "cpu": "node" if rng.random() < 0.05 else rng.choice([1, 2, 2, 4, 4, 8]),
            "memory": f"{rng.randrange(1, 24)}Gi",
            "placement": placement,
            "gateway": {"enabled": rng.random() < 0.9},
        }
        meta = {"name": f"model-{i:05d}", "namespace": f"ns-{i % 50}"}
        out.append(
            LocalModel.model_validate(
                {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
            )
        )
    return out


def best_of(runs: int, *args: Any) -> tuple[float, Plan]:
    """The fastest of ``runs`` calls of plan(*args), and its result."""
    best, result = float("inf"), Plan()
    for _ in range(runs):
        start = time.process_time()
        result = plan(*args)
        best = min(best, time.process_time() - start)
    return best, result


def desired_best_of(
    runs: int, lms: list[LocalModel], nodes: list[NodeFacts], usage: dict[str, Usage]
) -> tuple[float, int]:
    """The fastest of ``runs`` desired_state() passes, and the pods it rendered."""
    best, pods = float("inf"), 0
    for _ in range(runs):
        start = time.process_time()
        state = desired_state(lms, nodes, now="2026-01-01T00:00:00Z", usage=usage)
        best = min(best, time.process_time() - start)
        pods = sum(1 for m in state.models for o in m.objects if o["kind"] == "Pod")
    return best, pods


def main() -> None:
    print(
        f"{'nodes':>6} {'models':>6} {'placed':>6} {'unplaced':>8} "
        f"{'plan':>9} {'per node':>10} {'vs linear':>9} {'re-plan':>9} {'vs linear':>9}"
    )
    base: tuple[float, float] | None = None
    for n in (1_000, 5_000, 10_000):
        rng = random.Random(n)
        nodes, usage = cluster(n, rng)
        demands = models(n // 2, nodes, rng)
        fresh, result = best_of(5, demands, nodes, {}, usage)
        current = result.as_current()
        again, replanned = best_of(5, demands, nodes, current, usage)
        assert replanned == result, "re-planning changed the plan"
        per, per_again = fresh / n, again / n
        if base is None:
            base = (per, per_again)
        print(
            f"{n:>6} {len(demands):>6} {len(result.placements):>6} {len(result.unplaced):>8} "
            f"{fresh * 1000:>7.1f}ms {per * 1e6:>8.2f}us {per / base[0]:>9.2f} "
            f"{again * 1000:>7.1f}ms {per_again / base[1]:>9.2f}"
        )
    print()
    print(
        f"{'nodes':>6} {'models':>6} {'pods':>6} {'plan':>9} {'desired_state':>13} "
        f"{'x plan':>7} {'per model':>10} {'vs linear':>9}"
    )
    first: float | None = None
    for n in (1_000, 5_000, 10_000):
        rng = random.Random(n)
        nodes, usage = cluster(n, rng)
        lms = local_models(n // 2, nodes, rng)
        planned, _ = best_of(3, [demand(lm) for lm in lms], nodes, {}, usage)
        desired, pods = desired_best_of(3, lms, nodes, usage)
        per_model = desired / len(lms)
        first = first or per_model
        print(
            f"{n:>6} {len(lms):>6} {pods:>6} {planned * 1000:>7.1f}ms "
            f"{desired * 1000:>11.1f}ms {desired / planned:>7.1f} {per_model * 1e6:>8.0f}us "
            f"{per_model / first:>9.2f}"
        )


if __name__ == "__main__":
    main()
