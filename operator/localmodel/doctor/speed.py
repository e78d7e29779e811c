"""doctor on a slow replica: what the operator measured, and the likely causes
doctor can check. Pure.

The operator writes each replica's speed to `status.placements[].speed` and
turns `SlowReplica` true when a replica decodes below half its expected rate
for a while (docs/operator.md, Speed). For each slow replica doctor reports
the numbers, then the causes it can check, most likely first:

1. **CPU throttling of the engine's container**: the kubelet's cAdvisor
   counters (`container_cpu_cfs_throttled_periods_total` over
   `container_cpu_cfs_periods_total`), read until that container's counters
   moved (cAdvisor refreshes them every 10-15 s; the text as a whole differs
   on every read, since `container_last_seen` is stamped with the time of the
   read), so the share is of now, not of the container's life. When they are
   missing or did not move, doctor says the check was not made. An engine
   alone in its container with threads equal to its limit is rarely
   throttled; something else running in it (a sidecar process, a runaway
   script), or more threads than the limit, is.
2. **More threads than the CPU limit**: other processes in the engine's
   container (cAdvisor's `container_processes`, the processes in its cpu
   cgroup, above the engine's own: llama-server 1, Ollama 2 with its model's
   runner), which share its CPU whether or not the quota is reached (on a
   busy node it is not, and nothing is throttled); or a thread count
   overridden through the engine's own settings (its command line or the
   operator's Modelfile against the container's limit).
3. **Other pods on the node without a CPU limit**: they take whatever the
   CPUs have left, and with no static CPU manager the engine's quota shares
   cores with them.
4. **SMT siblings**: on a node with more than one hardware thread per core
   (the probe's facts), another pod may run on the other half of the engine's
   cores.

What doctor cannot see (an engine version that lost a fast path, a neighbour
streaming memory) is named when nothing it can check explains the slowness.
Then, for every slow replica, **the node's memory**: the bandwidth its probe
measured and the replica's decode ceiling (`localmodel.ceiling`: the operator
judges a replica against half of it as well as against its peers), or why there
is none (the node not measured yet, or a label the operator ignored, with the
reason).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localmodel.doctor.report import Finding, Verdict
from localmodel.engines.registry import ENGINES
from localmodel.facts import NodeFacts
from localmodel.facts.node import bandwidth_from_labels
from localmodel.speed import CEILING_SHARE

THROTTLED = "container_cpu_cfs_throttled_periods_total"
PERIODS = "container_cpu_cfs_periods_total"
PROCESSES = "container_processes"  # in the container's cpu cgroup
# (The processes an engine's container runs of its own are its adapter's:
# `EngineDoctor.processes`.)
# A share of CFS periods throttled above this, over the sampled seconds, is named.
THROTTLED_SHARE = 0.2
CADVISOR_PATH = "metrics/cadvisor"  # the kubelet's, through nodes/<node>/proxy


@dataclass(frozen=True)
class Watched:
    """An engine container whose CFS counters doctor samples: by its namespace,
    pod and container names, or by its runtime ID at the end of its cgroup."""

    namespace: str
    pod: str
    container: str
    container_id: str = ""


@dataclass(frozen=True)
class SlowReplica:
    """One replica the doctor looks at for slowness: where it runs, its threads and CPU, and what
    its speed said."""

    namespace: str
    model: str
    replica: int
    node: str
    pod: str
    threads: int
    cpu: int
    speed: Mapping[str, Any]


def slow_replicas(models: Sequence[Mapping[str, Any]]) -> list[SlowReplica]:
    """Every replica a LocalModel's status marks slow."""
    out = []
    for lm in models:
        meta = lm.get("metadata") or {}
        for p in (lm.get("status") or {}).get("placements") or []:
            speed = p.get("speed") or {}
            if speed.get("slow"):
                out.append(SlowReplica(str(meta.get("namespace", "")), str(meta.get("name", "")),
                                       int(p.get("replica", 0)), str(p.get("node", "")),
                                       str(p.get("pod", "")), int(p.get("threads") or 0),
                                       int(p.get("cpu") or 0), speed))
    return out


_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)(?:\s+-?\d+)?\s*$')
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _counters(text: str, namespace: str, pod: str, container: str,
              container_id: str = "", names: tuple[str, ...] = (THROTTLED, PERIODS)
              ) -> dict[str, float]:
    """The CFS counters (or other `names`) of one container in the kubelet's
    cAdvisor text: by its namespace, pod and container labels, or by its cgroup
    (`id`, which ends with the container's runtime ID: cAdvisor leaves the names
    empty when it cannot ask the runtime). Lenient: only these lines are read."""
    if "\n" not in text and "\\n" in text:  # a client that handed back a repr
        text = text.replace("\\n", "\n")
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        match = _LINE.match(line.strip())
        if match is None or match.group(1) not in names:
            continue
        labels = dict(_PAIR.findall(match.group(2)))
        named = (labels.get("namespace"), labels.get("pod"), labels.get("container")) == (
            namespace, pod, container)
        by_id = bool(container_id) and labels.get("id", "").endswith(container_id)
        if not (named or by_id):
            continue
        try:
            found[match.group(1)] = float(match.group(3))
        except ValueError:
            continue
    return found


def throttled_share(before: str, after: str, namespace: str, pod: str,
                    container: str, container_id: str = "") -> float | None:
    """The share of CFS periods the container was throttled in between two
    cAdvisor samples; None when the counters are not there or did not move."""
    a = _counters(before, namespace, pod, container, container_id)
    b = _counters(after, namespace, pod, container, container_id)
    if len(a) < 2 or len(b) < 2 or b[PERIODS] <= a[PERIODS]:
        return None
    return max(0.0, min(1.0, (b[THROTTLED] - a[THROTTLED]) / (b[PERIODS] - a[PERIODS])))


def counters_moved(before: str, after: str, watched: Sequence[Watched]) -> bool:
    """Whether a second cAdvisor sample is worth comparing with the first: the
    CFS periods of every watched container the first sample has moved. Not the
    text as a whole: it differs on every read (`container_last_seen` carries the
    time of the read), while one container's counters change only when cAdvisor
    refreshes that container (every 10-15 s). A container the first sample
    lacks is not waited for (its counters will not appear)."""
    for w in watched:
        if len(_counters(before, w.namespace, w.pod, w.container, w.container_id)) < 2:
            continue
        if throttled_share(before, after, w.namespace, w.pod, w.container,
                           w.container_id) is None:
            return False
    return True


def _no_limit_neighbours(pods: Sequence[Mapping[str, Any]], node: str, own: str) -> list[str]:
    names = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        if spec.get("nodeName") != node or meta.get("name") == own:
            continue
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        unlimited = any(not ((c.get("resources") or {}).get("limits") or {}).get("cpu")
                        for c in spec.get("containers") or [])
        if unlimited:
            names.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return sorted(names)


def _rate(speed: Mapping[str, Any], key: str) -> str:
    value = speed.get(key)
    return "?" if value is None else f"{value:g}"


def slow_findings(
    models: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeFacts],
    engine_threads: Mapping[str, tuple[int | None, int | None, str, str, str]],
    cadvisor: Mapping[str, tuple[str, str] | Exception],
) -> list[Finding]:
    """`engine_threads`: "namespace/pod" -> (threads, CPU limit in milli-CPUs,
    engine container name, its runtime ID, the engine); `cadvisor`: node -> two
    samples, or why not read."""
    findings: list[Finding] = []
    for slow in slow_replicas(models):
        s = slow.speed
        where = f"{slow.namespace}/{slow.model} replica {slow.replica} (pod {slow.pod}, node " \
                f"{slow.node})"
        findings.append(Finding(
            "slow-replica", Verdict.FAIL,
            f"{where} decodes {_rate(s, 'recentDecode')} tok/s, expected "
            f"{_rate(s, 'expectedDecode')} tok/s ({s.get('expectedSource') or '?'}); "
            f"calibrated at {_rate(s, 'calibrationDecode')} tok/s",
            "see the likely causes below",
        ))
        seen = _Seen(slow, where, *engine_threads.get(
            f"{slow.namespace}/{slow.pod}", (None, None, "", "", "")))
        samples = cadvisor.get(slow.node)
        causes = _throttling(seen, samples) + _processes(seen, samples)
        causes += _neighbours_and_threads(seen, pods, nodes.get(slow.node))
        if not causes:
            causes.append(Finding(
                "slow-replica", Verdict.WARN,
                f"{where}: no cause doctor can check was found (no throttling, threads within "
                "the limit, no unlimited neighbours, no SMT): compare the node's hardware and "
                "the engine version with its peers'",
                "move the replica (delete its pod) and compare",
            ))
        findings += causes + _memory(seen, nodes.get(slow.node))
    return findings


@dataclass(frozen=True)
class _Seen:
    """A slow replica and what doctor knows of its engine container."""

    slow: SlowReplica
    where: str
    threads: int | None
    limit: int | None  # milli-CPUs
    container: str
    container_id: str
    engine: str


def _throttling(seen: _Seen, samples: tuple[str, str] | Exception | None) -> list[Finding]:
    slow, where, container = seen.slow, seen.where, seen.container
    if isinstance(samples, Exception):
        return [Finding(
            "slow-replica", Verdict.WARN,
            f"{where}: CPU throttling not checked: the kubelet's cAdvisor metrics of "
            f"node {slow.node} could not be read ({samples})",
            "grant get on nodes/proxy to read them, or check cpu.stat in the container",
        )]
    if samples is None or not container:
        return []
    share = throttled_share(*samples, slow.namespace, slow.pod, container, seen.container_id)
    if share is not None and share >= THROTTLED_SHARE:
        return [Finding(
            "slow-replica", Verdict.FAIL,
            f"{where}: CPU throttling: container {container} was throttled in "
            f"{share:.0%} of its CFS periods just now (cAdvisor "
            f"{THROTTLED}): something besides the engine's threads uses its CPU "
            "limit, or the engine runs more threads than the limit",
            f"look for other processes: kubectl exec -n {slow.namespace} {slow.pod} "
            f"-c {container} -- top; or raise spec.cpu",
        )]
    if share is not None:
        return []
    found = _counters(samples[1], slow.namespace, slow.pod, container, seen.container_id)
    why = ("did not move while doctor read them (cAdvisor refreshes them every "
           "10-15 s)" if len(found) == 2 else
           "are not in them (cAdvisor has them only for a container with a CPU "
           "limit)")
    return [Finding(
        "slow-replica", Verdict.WARN,
        f"{where}: CPU throttling not checked: the CFS counters of container "
        f"{container} in the kubelet's cAdvisor metrics of node {slow.node} {why}",
        "run doctor again, or read nr_throttled in the container's cgroup cpu.stat "
        "on the node",
    )]


def _processes(seen: _Seen, samples: tuple[str, str] | Exception | None) -> list[Finding]:
    slow, where, container = seen.slow, seen.where, seen.container
    engine = ENGINES.get(seen.engine)
    if not isinstance(samples, tuple) or not container or engine is None:
        return []
    own = engine.doctor.processes
    counted = _counters(samples[1], slow.namespace, slow.pod, container, seen.container_id,
                        (PROCESSES,)).get(PROCESSES)
    if counted is None or counted <= own:
        return []
    cpus = "?" if seen.limit is None else f"{seen.limit / 1000:g}"
    return [Finding(
        "slow-replica", Verdict.FAIL,
        f"{where}: container {container} runs {counted:g} processes where "
        f"{seen.engine} runs {own} (cAdvisor {PROCESSES}): the others share its CPU "
        f"limit of {cpus} with the engine's threads: oversubscribed, throttled "
        "or not",
        f"find them: kubectl exec -n {slow.namespace} {slow.pod} -c {container} "
        "-- ps -ef (or top); stop them, or give them a container of their own",
    )]


def _neighbours_and_threads(seen: _Seen, pods: Sequence[Mapping[str, Any]],
                            facts: NodeFacts | None) -> list[Finding]:
    slow, where, threads, limit = seen.slow, seen.where, seen.threads, seen.limit
    causes: list[Finding] = []
    if threads is not None and limit is not None and threads * 1000 > limit:
        causes.append(Finding(
            "slow-replica", Verdict.FAIL,
            f"{where}: the engine runs {threads} threads on a CPU limit of "
            f"{limit / 1000:g}: oversubscribed threads collapse decode",
            f"use {max(1, limit // 1000)} threads (remove the override)",
        ))
    neighbours = _no_limit_neighbours(pods, slow.node, slow.pod)
    if neighbours:
        shown = ", ".join(neighbours[:5]) + (" ..." if len(neighbours) > 5 else "")
        causes.append(Finding(
            "slow-replica", Verdict.WARN,
            f"{where}: {len(neighbours)} other pod(s) on node {slow.node} have no CPU "
            f"limit ({shown}): they take whatever CPU is left, on the engine's cores too",
            "give them CPU limits, or run the model with placement.exclusive",
        ))
    if facts is not None and facts.threads_per_core and facts.threads_per_core > 1:
        causes.append(Finding(
            "slow-replica", Verdict.WARN,
            f"{where}: node {slow.node} has {facts.threads_per_core} hardware threads per "
            "core: another pod may run on the SMT siblings of the engine's CPUs",
            "enable the kubelet's static CPU manager (full-pcpus-only) or exclusive placement",
        ))
    return causes


def _memory(seen: _Seen, facts: NodeFacts | None) -> list[Finding]:
    """The node's measured bandwidth and the replica's ceiling, or why the operator has none."""
    slow, where = seen.slow, seen.where
    source = str(slow.speed.get("expectedSource") or "")
    bandwidth, why = bandwidth_from_labels(facts.labels) if facts is not None else (None, "")
    if bandwidth is None:
        return [Finding(
            "slow-replica", Verdict.WARN,
            f"{where}: no decode ceiling: node {slow.node}'s memory bandwidth "
            + (f"label was ignored: {why}" if why else "was not measured (the node probe "
               "measures it at its start and daily, on a quiet node)"),
            "check the node probe's log on that node (kubectl logs of its DaemonSet pod)",
        )]
    every = (f", {bandwidth.all_threads / 1e9:.3g} GB/s at {bandwidth.threads} threads"
             if bandwidth.all_threads is not None else "")
    judged = "ceiling" in source
    return [Finding(
        "slow-replica", Verdict.FAIL if source.startswith(f"{CEILING_SHARE:g} of the ceiling")
        else Verdict.WARN,
        f"{where}: node {slow.node}'s memory reads {bandwidth.one_thread / 1e9:.3g} GB/s at 1 "
        f"thread{every} (its probe); "
        + (f"expected {source}: below half of that, the replica loses time to something "
           "other than reading its weights (another pod streaming memory on the node, CPU "
           "time taken from it, an engine build without its fast path)" if judged else
           "the replica's model has no known size, so no ceiling"),
        "compare with docs/benchmarks.md (Decode against the memory-bandwidth ceiling)",
    )]
