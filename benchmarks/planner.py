"""What a reconcile pass costs as the cluster grows, and what a pass after one
change costs: `plan()`, the whole pass (`desired_state()`), the long-lived planner and
`Desired` the operator keeps between passes, and the operator's own memory and
CPU per pass, side by side in one run.

Run: python benchmarks/planner.py [--quick] [--json] [--sizes N ...]
  full:  1k, 5k and 10k nodes with half as many models (minutes of CPU)
  quick: 200, 400 and 800 nodes (seconds; CI runs it, tests/benchmarks/test_quick_modes.py)

Realistic, mixed clusters: four node shapes (4 to 32 CPUs, allocatable a bit
below capacity), three zones, a unique hostname label per node, DaemonSet usage
on every node, 10% of nodes tainted NoSchedule, 5% PreferNoSchedule, 1%
cordoned. Models ask for 1 to 8 CPUs (5% ask for the whole node), 1 to 24 GiB;
80% are exclusive, 20% use a node selector (pool or zone; 1% pin a hostname),
10% tolerate the dedicated taint. One replica each.

Times are this process's CPU time (best of several), so other work on a busy
machine counts less; "vs 1k" (or vs the smallest size) divides the cost per
node or per model by the smallest size's: 1.0 means linear growth.

1. `plan()`: a fresh plan, and a re-plan of its own output (the steady state).
2. The whole pass (prepare, plan, tune, render, status), cold (a fresh
   `incremental.Desired`: nothing reused), then with a long-lived `Desired`
   in its steady state: a pass with nothing changed, a pass after one model's
   edit (its context doubled: new tuning, objects and status) and a pass after
   one node's label change (a node running a model moves to another zone: it
   leaves and joins zone views). The last incremental result is checked equal
   to the plain `desired_state()` of the same inputs.
3. The operator at the largest size (`--no-operator` leaves it out): the
   watches' stored objects (generated as the API returns them: Nodes with NFD
   labels, conditions, images and managedFields, the operator's pods and two
   DaemonSet pods per node, the LocalModels with a status; kept as the watches
   keep them, `watched.SHAPES`), the memory they take, and one
   operator pass (`observe` + `plan.plan_pass`, what the reconciler runs
   between its reads and writes): cold, steady, after a node label change.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel, Toleration, parse_local_model
from localmodel.controller.changes import with_applied_hash
from localmodel.controller.parse_memo import Parsed
from localmodel.controller.plan import plan_pass
from localmodel.controller.reconcile import gc_paused
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.watch_shape import plain
from localmodel.controller.watched import WATCHED
from localmodel.desired import DesiredState, demand, desired_state
from localmodel.facts import NodeFacts, Taint
from localmodel.incremental import Desired
from localmodel.planner import CpuRequest, ModelDemand, Usage, plan
from localmodel.render import RenderOptions

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
                cpu=CpuRequest(None if rng.random() < 0.05 else rng.choice([1, 2, 2, 4, 4, 8])),
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
        meta = {"name": f"model-{i:05d}", "namespace": f"ns-{i % 50}", "uid": f"uid-{i:05d}"}
        out.append(
            parse_local_model(
                {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
            )
        )
    return out


T = TypeVar("T")
NOW = "2026-01-01T00:00:00Z"
FULL = (1_000, 5_000, 10_000)
QUICK = (200, 400, 800)


def cpu_time(f: Callable[[], T]) -> tuple[float, T]:
    start = time.process_time()
    out = f()
    return time.process_time() - start, out


def best_of(runs: int, f: Callable[[], T]) -> tuple[float, T]:
    """The fastest of ``runs`` calls of f (CPU seconds), and its last result."""
    best, result = float("inf"), None
    for _ in range(runs):
        took, result = cpu_time(f)
        best = min(best, took)
    return best, result  # type: ignore[return-value]


def same(a: DesiredState, b: DesiredState) -> bool:
    return a.models == b.models and a.plan == b.plan


def plan_row(n: int, runs: int) -> dict[str, Any]:
    rng = random.Random(n)
    nodes, usage = cluster(n, rng)
    demands = models(n // 2, nodes, rng)
    fresh, result = best_of(runs, lambda: plan(demands, nodes, {}, usage))
    current = result.as_current()
    again, replanned = best_of(runs, lambda: plan(demands, nodes, current, usage))
    assert replanned == result, "re-planning changed the plan"
    return {"nodes": n, "models": len(demands), "placed": len(result.placements),
            "unplaced": len(result.unplaced), "plan_s": fresh, "replan_s": again}


def plan_table(sizes: tuple[int, ...], runs: int) -> dict[str, Any]:
    print(
        f"{'nodes':>6} {'models':>6} {'placed':>6} {'unplaced':>8} "
        f"{'plan':>9} {'per node':>10} {'vs ' + str(sizes[0]):>8} {'re-plan':>9} "
        f"{'vs ' + str(sizes[0]):>8}"
    )
    rows = [plan_row(n, runs) for n in sizes]
    base = rows[0]["plan_s"] / rows[0]["nodes"], rows[0]["replan_s"] / rows[0]["nodes"]
    for r in rows:
        n = r["nodes"]
        per, per_again = r["plan_s"] / n, r["replan_s"] / n
        r["per_node_vs_first"] = round(per / base[0], 2)
        print(
            f"{n:>6} {r['models']:>6} {r['placed']:>6} {r['unplaced']:>8} "
            f"{r['plan_s'] * 1000:>7.1f}ms {per * 1e6:>8.2f}us {per / base[0]:>8.2f} "
            f"{r['replan_s'] * 1000:>7.1f}ms {per_again / base[1]:>8.2f}"
        )
    return {"plan": rows}


def edited(lm: LocalModel) -> LocalModel:
    """The same model with its context doubled (a new stored version)."""
    body = lm.model_dump(by_alias=True, exclude_none=True, exclude={"status"})
    body["spec"]["context"] = lm.spec.context * 2
    body["metadata"]["generation"] = (lm.metadata.generation or 1) + 1
    return parse_local_model(body)


def relabelled(f: NodeFacts) -> NodeFacts:
    zone = f.labels["topology.kubernetes.io/zone"]
    other = f"zone-{(int(zone.rsplit('-', 1)[1]) + 1) % 3}"
    return dataclasses.replace(f, labels={**f.labels, "topology.kubernetes.io/zone": other})


def compared(state: DesiredState) -> DesiredState:
    """`state`, with what the operator's changes compare with what exists read
    from every model: each pod's and each applied object's digest (the pass
    works them out). Manifests are made only for objects to write, so no pass
    here makes one."""
    for m in state.models:
        m.pod_hashes, m.applied_hashes  # noqa: B018 (read for their cost)
    return state


def pass_row(n: int, runs: int) -> dict[str, Any]:
    rng = random.Random(n)
    nodes, usage = cluster(n, rng)
    lms = local_models(n // 2, nodes, rng)
    planned, _ = best_of(runs, lambda: plan([demand(lm) for lm in lms], nodes, {}, usage))
    # A cold pass: a fresh `Desired` (the operator's first), nothing reused.
    gc_on, _ = best_of(runs, lambda: compared(Desired().state(lms, nodes, now=NOW, usage=usage)))

    def as_the_operator_runs_it() -> DesiredState:  # the collector held off (gc_paused)
        with gc_paused():
            return compared(Desired().state(lms, nodes, now=NOW, usage=usage))

    cold, state = best_of(runs, as_the_operator_runs_it)
    pods = sum(len(m.pod_hashes) for m in state.models)
    # The operator's steady state: a long-lived Desired, current = its plan.
    current = state.plan.as_current()
    desired = Desired()

    def incremental(ms: list[LocalModel], ns: list[NodeFacts]) -> tuple[float, DesiredState]:
        def one() -> DesiredState:
            with gc_paused():
                return compared(desired.state(ms, ns, now=NOW, current=current, usage=usage))

        return cpu_time(one)

    incremental(lms, nodes)
    steady = min(incremental(lms, nodes)[0] for _ in range(runs))
    placed = state.plan.placements
    i = next(k for k, lm in enumerate(lms) if lm.key == placed[len(placed) // 2].model)
    j = next(k for k, f in enumerate(nodes) if f.name == placed[len(placed) // 3].node)
    model_edits = [[*lms[:i], variant, *lms[i + 1:]] for variant in (edited(lms[i]), lms[i])]
    node_edits = [[*nodes[:j], v, *nodes[j + 1:]] for v in (relabelled(nodes[j]), nodes[j])]
    edit_s, label_s, rekept = float("inf"), float("inf"), 0
    for _ in range(runs):  # each change, then back: two measured passes
        for ms in model_edits:
            edit_s = min(edit_s, incremental(ms, nodes)[0])
        for ns in node_edits:
            label_s = min(label_s, incremental(lms, ns)[0])
            rekept = max(rekept, desired.planner.nodes_rekept)
    # The incremental result after both changes, against the plain full pass.
    _, got = incremental(model_edits[0], node_edits[0])
    fresh = desired_state(model_edits[0], node_edits[0], now=NOW, current=current, usage=usage)
    assert same(got, fresh), "the incremental pass differs from a fresh full pass"
    return {
        "nodes": n, "models": len(lms), "pods": pods, "plan_s": round(planned, 4),
        "full_pass_s": round(cold, 4), "full_pass_gc_on_s": round(gc_on, 4),
        "steady_pass_s": round(steady, 5),
        "model_edit_pass_s": round(edit_s, 5), "node_label_pass_s": round(label_s, 5),
        "nodes_rekept": rekept,
    }


def pass_table(sizes: tuple[int, ...], runs: int) -> dict[str, Any]:
    print(
        f"{'nodes':>6} {'models':>6} {'pods':>6} {'plan':>9} {'gc on':>9} {'cold pass':>10} "
        f"{'per model':>10} {'vs ' + str(sizes[0]):>8} {'steady':>9} {'model edit':>10} "
        f"{'node label':>10} {'rekept':>6}"
    )
    rows = [pass_row(n, runs) for n in sizes]
    first = rows[0]["full_pass_s"] / rows[0]["models"]
    for r in rows:
        per_model = r["full_pass_s"] / r["models"]
        r["per_model_vs_first"] = round(per_model / first, 2)
        print(
            f"{r['nodes']:>6} {r['models']:>6} {r['pods']:>6} {r['plan_s'] * 1000:>7.1f}ms "
            f"{r['full_pass_gc_on_s'] * 1000:>7.0f}ms "
            f"{r['full_pass_s'] * 1000:>8.1f}ms {per_model * 1e6:>8.0f}us "
            f"{per_model / first:>8.2f} {r['steady_pass_s'] * 1000:>7.1f}ms "
            f"{r['model_edit_pass_s'] * 1000:>8.1f}ms {r['node_label_pass_s'] * 1000:>8.1f}ms "
            f"{r['nodes_rekept']:>6}"
        )
    print("cold pass: a fresh Desired as the operator runs it (the cycle collector "
          "held off, then one young collection: reconcile.gc_paused), with every digest the "
          "operator's changes compare (pods', applied objects'); gc on: the same with "
          "the collector running throughout; steady/model edit/node label: a long-lived "
          "Desired (the operator's); the last checked equal to the plain desired_state; rekept: "
          "nodes the planner re-kept for the node label change.")
    return {"passes": rows}


# ---- the operator at scale: the watches' objects, their memory, one pass ----------

NFD_FLAGS = ("ADX", "AESNI", "AVX", "AVX2", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512F",
             "AVX512VL", "AVX512VNNI", "BMI1", "BMI2", "CMPXCHG8", "F16C", "FMA3", "FXSR",
             "MOVBE", "OSXSAVE", "SHA", "SSE4", "SSE42", "SSSE3", "VAES", "VPCLMULQDQ")


def node_body(f: NodeFacts, i: int) -> dict[str, Any]:
    """A Node as the API server returns it (what the operator's watch keeps whole)."""
    labels = {**f.labels, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
              "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
              "feature.node.kubernetes.io/cpu-model.family": "6",
              "feature.node.kubernetes.io/cpu-model.id": "143",
              **{f"feature.node.kubernetes.io/cpu-cpuid.{x}": "true" for x in NFD_FLAGS}}
    cpu, mem = f"{f.allocatable_cpu_milli}m", str(f.allocatable_memory_bytes)
    fields = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": f.name, "uid": f"node-uid-{i}", "resourceVersion": str(1000 + i),
            "creationTimestamp": NOW, "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            "nfd.node.kubernetes.io/feature-labels": ",".join(NFD_FLAGS)},
            "managedFields": [
                {"manager": m, "operation": "Update", "apiVersion": "v1", "time": NOW,
                 "fieldsType": "FieldsV1", "fieldsV1": fields}
                for m in ("kubelet", "nfd-master", "kube-controller-manager")],
        },
        "spec": {"podCIDR": f"10.{i // 250 % 250}.{i % 250}.0/24",
                 "taints": [{"key": t.key, "value": t.value, "effect": t.effect}
                            for t in f.taints],
                 **({"unschedulable": True} if not f.schedulable else {})},
        "status": {
            "capacity": {"cpu": str(f.allocatable_cpu_milli // 1000 + 1), "memory": mem,
                         "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": cpu, "memory": mem, "pods": "110",
                            "ephemeral-storage": "95Gi"},
            "conditions": [{"type": t, "status": "True" if t == "Ready" else "False",
                            "lastHeartbeatTime": NOW, "lastTransitionTime": NOW,
                            "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
                           for t in ("MemoryPressure", "DiskPressure", "PIDPressure",
                                     "Ready")],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                          {"type": "Hostname", "address": f.name}],
            "nodeInfo": {"kubeletVersion": "v1.35.0", "containerRuntimeVersion":
                         "containerd://2.0.0", "kernelVersion": "6.8.0",
                         "osImage": "Ubuntu 24.04", "architecture": "amd64",
                         "operatingSystem": "linux", "machineID": f"{i:032x}",
                         "systemUUID": f"{i:032x}", "bootID": f"{i:032x}"},
            "images": [{"names": [f"registry.example/image-{k}@sha256:{k:064x}",
                                  f"registry.example/image-{k}:v1"],
                        "sizeBytes": 10_000_000 * (k + 1)} for k in range(8)],
        },
    }


def daemon_pod(node: str, k: int, cpu: int, memory: int) -> dict[str, Any]:
    return {"metadata": {"name": f"ds-{k}-{node}", "namespace": "kube-system",
                         "uid": f"ds-{k}-{node}", "labels": {"app": f"ds-{k}"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": f"ds-{k}", "uid": f"ds{k}",
                                              "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "requests": {"cpu": f"{cpu}m", "memory": str(memory)}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def stored(manifest: dict[str, Any], k: int) -> dict[str, Any]:
    """An object the operator created, as the API server then holds it."""
    applied = manifest["kind"] in ("ConfigMap", "Service")  # server-side applied
    obj = json.loads(json.dumps(with_applied_hash(manifest) if applied else manifest))
    meta = obj["metadata"]
    meta.update(uid=f"obj-uid-{k}", resourceVersion=str(10**6 + k), creationTimestamp=NOW)
    if obj["kind"] == "Pod":
        obj["spec"]["nodeName"] = meta["annotations"]["localmodel.dev/node"]
        obj["status"] = {"phase": "Running", "conditions": [{"type": "Ready",
                                                              "status": "True"}]}
    return obj


def kept(name: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    row = next(w for w in WATCHED if w.name == name)
    return [row.keep(b) for b in bodies if row.selected(b)]


OPTIONS = RenderOptions(operator_image="localmodel-operator:bench")


def watched_bodies(n: int) -> tuple[DesiredState, dict[str, list[dict[str, Any]]]]:
    """`n` nodes and n/2 models converged: the objects the operator's watches
    receive, by watch name (`watched.WATCHED`), before a watch keeps them.
    benchmarks/converge.py --memory feeds the same to a fresh operator process."""
    rng = random.Random(n)
    facts, usage = cluster(n, rng)
    lms = local_models(n // 2, facts, rng)
    state = desired_state(lms, facts, now=NOW, usage=usage, options=OPTIONS)
    objects = [stored(o, k) for k, o in enumerate(o for m in state.models for o in m.objects)]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    return state, {
        "localmodels": [
            {**r.with_status.model_dump(by_alias=True, exclude_none=True, mode="json"),
             "metadata": {**r.model.metadata.model_dump(by_alias=True, exclude_none=True),
                          "resourceVersion": str(k + 1)}}
            for k, r in enumerate(state.models)],
        "nodes": [node_body(f, i) for i, f in enumerate(facts)],
        "pods": by_kind.get("Pod", []) + [
            daemon_pod(name, k, u.cpu_milli // 2, u.memory_bytes // 2)
            for name, u in usage.items() for k in range(2)],
        "claims": by_kind.get("PersistentVolumeClaim", []),
        "configmaps": by_kind.get("ConfigMap", []),
        "services": by_kind.get("Service", []),
    }


def operator_section(n: int, runs: int) -> dict[str, Any]:
    state, bodies = watched_bodies(n)
    options = OPTIONS
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    snap = Snapshot(**{name: kept(name, b) for name, b in bodies.items()})
    stored_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del bodies
    parsed, desired = Parsed(), Desired()
    placed: dict[str, dict[int, str]] = {}

    def one_pass(s: Snapshot) -> int:
        nonlocal placed
        with gc_paused():
            obs = observe(s, (), parsed)
            out = plan_pass(obs, NOW, options, placed=placed, avoid={}, desired=desired)
        placed = out.placed
        return sum(len(w.changes.changes) for w in out.work)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cold, writes = cpu_time(lambda: one_pass(snap))
    kept_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    steady, steady_writes = best_of(runs, lambda: one_pass(snap))
    on = state.plan.placements[0].node
    i = next(k for k, b in enumerate(snap.nodes) if b["metadata"]["name"] == on)
    moved = plain(snap.nodes[i])
    zone = moved["metadata"]["labels"]["topology.kubernetes.io/zone"]
    moved["metadata"]["labels"]["topology.kubernetes.io/zone"] = zone + "-b"
    moved["metadata"]["resourceVersion"] += "-b"
    relabelled_snap = dataclasses.replace(snap, nodes=[*snap.nodes[:i], moved, *snap.nodes[i + 1:]])
    label, _ = cpu_time(lambda: one_pass(relabelled_snap))
    one_pass(snap)
    counts = {name: len(getattr(snap, name)) for name in ("localmodels", "nodes", "pods",
                                                          "claims", "configmaps", "services")}
    print(f"operator at {n} nodes, {len(state.models)} models: watches hold " + ", ".join(
        f"{v} {k}" for k, v in counts.items()))
    print(f"  memory: stored objects {stored_bytes / 2**20:.0f} MiB; a pass's parsed models/"
          f"nodes, planner index and Desired {kept_bytes / 2**20:.0f} MiB (tracemalloc)")
    print(f"  one operator pass (observe + plan_pass): cold {cold:.2f} s ({writes} writes "
          f"wanted: nothing existed yet in its memory), steady {steady * 1000:.0f} ms "
          f"({steady_writes} writes), after a node label change {label * 1000:.0f} ms")
    return {"operator": {"nodes": n, "models": len(state.models),
                         **{f"watched_{k}": v for k, v in counts.items()},
                         "stored_objects_mib": round(stored_bytes / 2**20, 1),
                         "pass_state_mib": round(kept_bytes / 2**20, 1),
                         "cold_pass_s": round(cold, 3), "steady_pass_s": round(steady, 4),
                         "node_label_pass_s": round(label, 4),
                         "steady_writes": steady_writes}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK}: seconds")
    parser.add_argument("--sizes", type=int, nargs="+", help=f"node counts (default {FULL})")
    parser.add_argument("--runs", type=int, help="best of (default 3; quick 2)")
    parser.add_argument("--no-operator", action="store_true", help="leave out section 3")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    sizes = tuple(args.sizes or (QUICK if args.quick else FULL))
    runs = args.runs or (2 if args.quick else 3)
    out: dict[str, Any] = {"sizes": list(sizes), "quick": args.quick}
    out |= plan_table(sizes, runs)
    print()
    out |= pass_table(sizes, runs)
    largest = out["passes"][-1]
    out |= {
        "largest_nodes": largest["nodes"],
        "full_pass_s": largest["full_pass_s"],
        "per_model_vs_first": largest["per_model_vs_first"],
        "model_edit_pass_s": largest["model_edit_pass_s"],
        "node_label_pass_s": largest["node_label_pass_s"],
    }
    if sizes == FULL:  # the names
        out |= {"full_pass_10k_s": largest["full_pass_s"],
                "per_model_vs_1k": largest["per_model_vs_first"],
                "model_edit_pass_10k_s": largest["model_edit_pass_s"],
                "node_label_pass_10k_s": largest["node_label_pass_s"]}
    if not args.no_operator:
        print()
        out |= operator_section(sizes[-1], runs)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
