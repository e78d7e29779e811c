"""`localmodel doctor` against a cluster: nodes, pods and the gateways' metrics.

`cluster_findings` is pure: the Node and Pod objects (as the API returns them,
plain dicts) and each gateway's metrics in, facts and findings out, in the
field's order:

1. models holding weights per node: our pods and any other pod running an
   Ollama or llama.cpp image; models with `spec.idle` that cannot wake, and why
   on each node (doctor/wake.py);
2. callers that can queue: each gateway's queue depth, busy slots, background
   turned away, foreground waiting;
3. cancellation: models served without the gateway;
4. speed, last: decode and prefill tok/s, prefill time, threads against the
   CPU limit, AMX nodes and the guard's state, nodes whose CPU is unknown.

`localmodel.doctor.read.gather_cluster` reads the cluster with the official
client. A gateway's metrics come through the API server's pod proxy
(``pods/<pod>:8090/proxy/metrics``, the gateway's admin port), or from a URL given with
``--metrics-url NAMESPACE/POD=URL`` (a port-forward, or a test).

Scope (`ClusterView.namespace`, ``--namespace``): the whole cluster, or the
model pods and LocalModels of one namespace. Scoped, a node holding one of
that namespace's models is still checked with every model it holds (they
contend for its cores whatever their namespace), and the node facts stay
cluster-wide (Nodes belong to no namespace).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from localmodel.doctor.checks import NUMA_SOURCE, queue_findings, speed_findings
from localmodel.doctor.gaps import gap_findings
from localmodel.doctor.metrics import GatewayStats, MetricsError, gateway_stats, parse_metrics
from localmodel.doctor.report import Finding, Verdict
from localmodel.doctor.speed import slow_findings
from localmodel.doctor.wake import idle_findings
from localmodel.engine_pods import EnginePod, engine_pods
from localmodel.engines.registry import engine
from localmodel.facts import FactSource, NodeFacts, NodeFactsError, from_node
from localmodel.facts.node import PROBE_FACTS_ANNOTATION
from localmodel.facts.quantity import format_bytes
from localmodel.facts.topology import parse_cpu_list
from localmodel.gateway_contract import ADMIN_PORT
from localmodel.podspec import (
    DEFAULT_DISK_BYTES_PER_SECOND,
    expected_load_seconds,
    startup_bound_seconds,
)
from localmodel.rules.steps import AMX_FLAGS
from localmodel.versions import Version, image_version, show_version

__all__ = ["ClusterView", "cluster_findings", "in_scope"]

@dataclass(frozen=True)
class ClusterView:
    """What the doctor read of the cluster: nodes, pods, LocalModels, gateways' metrics and
    cAdvisor samples, and the scope."""

    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    # "namespace/pod" of each gateway -> its metrics text, or why it could not be read.
    metrics: Mapping[str, str | Exception] = field(default_factory=dict)
    models: Sequence[Mapping[str, Any]] = ()  # LocalModels of every namespace, with status
    # node -> two samples of its kubelet's cAdvisor metrics (nodes with a slow replica)
    cadvisor: Mapping[str, tuple[str, str] | Exception] = field(default_factory=dict)
    namespace: str | None = None  # the scope: None, the whole cluster
    now: datetime | None = None  # when it was read (None: how long a wake waited is not judged)


def in_scope(scope: str | None, namespace: object) -> bool:
    """Whether an object of `namespace` is in doctor's scope (None: the whole cluster)."""
    return scope is None or namespace == scope


def _node_facts(nodes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, NodeFacts], list[str]]:
    facts: dict[str, NodeFacts] = {}
    bad: list[str] = []
    for index, node in enumerate(nodes):
        try:
            parsed = from_node(node, path=f"nodes[{index}]")
        except NodeFactsError as e:
            bad.append(str(e))
            continue
        facts[parsed.name] = parsed
    return facts, bad


def cluster_findings(view: ClusterView) -> tuple[dict[str, Any], list[Finding]]:
    nodes, bad_nodes = _node_facts(view.nodes)
    every = engine_pods(view.pods)
    pods = [p for p in every if in_scope(view.namespace, p.namespace)]
    held = {p.node for p in pods}
    gateways = [p for p in pods if p.gateway]
    models = [m for m in view.models
              if in_scope(view.namespace, (m.get("metadata") or {}).get("namespace"))]
    sources = {s.value: 0 for s in FactSource if s is not FactSource.MACHINE}
    for n in nodes.values():
        sources[n.source.value] = sources.get(n.source.value, 0) + 1
    facts: dict[str, Any] = {
        "nodes": len(nodes),
        "node_cpu_facts": sources,
        "model_pods": len(pods),
        "gateways": len(gateways),
    }
    if view.namespace is not None:
        facts["namespace"] = view.namespace
    findings: list[Finding] = [
        Finding("nodes", Verdict.WARN, f"unreadable Node: {b}", "fix the Node object")
        for b in bad_nodes
    ]
    findings += gap_findings(models, [p for p in view.pods if in_scope(
        view.namespace, (p.get("metadata") or {}).get("namespace"))])
    findings += _loading(pods, view.now.timestamp() if view.now is not None else None)
    findings += _models_per_node([p for p in every if p.node in held], nodes)
    findings += idle_findings(view.models, nodes, view.now, scope=view.namespace)
    findings += _queues(gateways, view.metrics)
    findings += _cancellation(pods)
    findings += _speed(gateways, view.metrics)
    findings += slow_findings(models, view.pods, nodes,
                              {p.key: (p.threads, p.cpu_milli, p.container, p.container_id,
                                       p.engine) for p in pods},
                              view.cadvisor)
    findings += _threads(pods, nodes)
    findings += _numa(pods, _numa_sizes(view.nodes))
    findings += _amx(pods, nodes)
    findings += _unknown_nodes(nodes)
    return facts, findings


def _models_per_node(pods: Sequence[EnginePod], nodes: Mapping[str, NodeFacts]) -> list[Finding]:
    by_node: dict[str, list[EnginePod]] = {}
    for pod in pods:
        by_node.setdefault(pod.node, []).append(pod)
    findings = []
    for node_name, held in sorted(by_node.items()):
        if len(held) < 2:
            continue
        node = nodes.get(node_name)
        parts = []
        for pod in held:
            memory = format_bytes(pod.memory_bytes) if pod.memory_bytes else "no memory limit"
            context = f"context {pod.context}" if pod.context else "context unknown"
            parts.append(f"{pod.label}: {memory}, {context}")
        memory_total = sum(p.memory_bytes or 0 for p in held)
        cpu_total = sum((p.threads * 1000 if p.threads else p.cpu_milli or 0) for p in held)
        over = []
        if node is not None and cpu_total > node.allocatable_cpu_milli:
            over.append(
                f"their threads ({cpu_total // 1000}) exceed the node's "
                f"{node.allocatable_cpus} CPUs"
            )
        if node is not None and memory_total > node.allocatable_memory_bytes:
            room = format_bytes(node.allocatable_memory_bytes)
            over.append(f"their memory exceeds the node's {room}")
        message = (
            f"node {node_name} holds {len(held)} models ({'; '.join(parts)}): together "
            f"{format_bytes(memory_total)} of weights, KV cache and buffers, and their threads "
            "contend for the same cores"
        )
        if over:
            message += "; " + " and ".join(over)
        others = [p for p in held if not p.ours] or held[1:]
        findings.append(
            Finding(
                "models-per-node",
                Verdict.FAIL if over else Verdict.WARN,
                message,
                f"one model per node: move or stop {', '.join(p.key for p in others)} "
                "(LocalModels keep one per node with placement.exclusive: true)",
            )
        )
    if not findings:
        findings.append(
            Finding(
                "models-per-node",
                Verdict.OK,
                f"{len(pods)} model pod{'s' if len(pods) != 1 else ''}, at most one per node",
            )
        )
    return findings


def _stats(key: str, metrics: Mapping[str, str | Exception]) -> GatewayStats | str:
    raw = metrics.get(key)
    if raw is None:
        return "not read"
    if isinstance(raw, Exception):
        return str(raw)
    try:
        return gateway_stats(parse_metrics(raw))
    except MetricsError as e:
        return str(e)


def _queues(gateways: Sequence[EnginePod], metrics: Mapping[str, str | Exception]) -> list[Finding]:
    findings = []
    for pod in gateways:
        stats = _stats(pod.key, metrics)
        if isinstance(stats, str):
            findings.append(
                Finding(
                    "queue",
                    Verdict.WARN,
                    f"{pod.label}: the gateway's metrics could not be read: {stats}",
                    f"check the pod is Ready, or pass --metrics-url {pod.key}=URL "
                    f"(e.g. after kubectl port-forward pod/{pod.name} {ADMIN_PORT})",
                )
            )
        else:
            timeline = f"localmodel timeline {pod.local_model or 'NAME'} -n {pod.namespace}"
            findings.extend(queue_findings(pod.label, stats, timeline))
    return findings


def _cancellation(pods: Sequence[EnginePod]) -> list[Finding]:
    findings = []
    for pod in pods:
        if pod.gateway:
            continue
        if pod.ours:
            fix = (
                f"set spec.gateway.enabled: true on LocalModel {pod.namespace}/"
                f"{pod.model or pod.name} (the gateway always streams upstream and closes it "
                "when the caller goes or the deadline passes)"
            )
        else:
            fix = (
                "run it as a LocalModel (its pods get the gateway), or add `localmodel gateway "
                f"--engine {pod.engine}` as a sidecar and point the Service at it"
            )
        findings.append(
            Finding(
                "cancellation",
                Verdict.WARN,
                f"{pod.label} on node {pod.node} is served without the gateway: a timed-out "
                "non-streaming call may keep running and hold its slot",
                fix,
            )
        )
    if not findings and pods:
        findings.append(Finding("cancellation", Verdict.OK, "every model is behind the gateway"))
    return findings


def _speed(gateways: Sequence[EnginePod], metrics: Mapping[str, str | Exception]) -> list[Finding]:
    findings = []
    for pod in gateways:
        stats = _stats(pod.key, metrics)
        if not isinstance(stats, str):
            findings.extend(speed_findings(pod.label, stats))
    return findings


def _threads(pods: Sequence[EnginePod], nodes: Mapping[str, NodeFacts]) -> list[Finding]:
    findings = []
    for pod in pods:
        limit = pod.cpu_milli
        node = nodes.get(pod.node)
        cap_milli = limit if limit is not None else (node.allocatable_cpu_milli if node else None)
        want = max(1, cap_milli // 1000) if cap_milli is not None else None
        where = f"{pod.label} on node {pod.node}"
        cpu_text = f"CPU limit {limit / 1000:g}" if limit is not None else "no CPU limit"
        if pod.threads is None:
            doctor = engine(pod.engine).doctor
            fix = (doctor.pod_threads_fix(want) if want
                   else "set a CPU limit and threads equal to it")
            findings.append(
                Finding(
                    "threads",
                    Verdict.WARN,
                    f"{where}: thread count not set ({doctor.threads_default}); {cpu_text}",
                    fix,
                )
            )
            continue
        if want is not None and pod.threads > cap_milli / 1000:  # type: ignore[operator]
            findings.append(
                Finding(
                    "threads",
                    Verdict.FAIL,
                    f"{where}: {pod.threads} threads ({pod.threads_source}) on {cpu_text}: "
                    "oversubscribed decode collapses",
                    f"use {want} threads",
                )
            )
        elif node is not None and node.threads_per_core and node.threads_per_core > 1:
            cores = node.physical_cores
            findings.append(
                Finding(
                    "threads",
                    Verdict.OK,
                    f"{where}: {pod.threads} threads on {cpu_text}; the node has "
                    f"{node.threads_per_core} hardware threads per core"
                    + (f" ({cores} cores)" if cores else "")
                    + ", so these CPUs may be SMT siblings: measure at half the threads",
                )
            )
        else:
            findings.append(
                Finding("threads", Verdict.OK, f"{where}: {pod.threads} threads on {cpu_text}")
            )
    return findings


def _numa_sizes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Node name -> CPUs per NUMA node, from the probe's facts annotation (when it has
    more than one NUMA node)."""
    sizes: dict[str, list[int]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(PROBE_FACTS_ANNOTATION)
        if not raw:
            continue
        try:
            numa = json.loads(raw).get("numa_nodes") or {}
            cpus = [len(parse_cpu_list(str(listed))) for listed in numa.values()]
        except (ValueError, AttributeError):
            continue
        if len(cpus) > 1:
            sizes[str(meta.get("name"))] = cpus
    return sizes


def _numa(pods: Sequence[EnginePod], sizes: Mapping[str, list[int]]) -> list[Finding]:
    findings = []
    for pod in pods:
        per_node = sizes.get(pod.node)
        if not per_node:
            continue
        cpus = pod.threads or (pod.cpu_milli // 1000 if pod.cpu_milli else None)
        smallest = min(per_node)
        where = f"{pod.label} on node {pod.node} ({len(per_node)} NUMA nodes of {smallest} CPUs)"
        if cpus is not None and cpus > smallest:
            findings.append(
                Finding(
                    "numa",
                    Verdict.WARN,
                    f"{where}: its {cpus} threads cannot fit in one NUMA node, so weights are "
                    f"read across the interconnect ({NUMA_SOURCE})",
                    f"use at most {smallest} CPUs (one NUMA node), or an engine NUMA "
                    "option (llama-server --numa distribute)",
                )
            )
        else:
            findings.append(
                Finding(
                    "numa",
                    Verdict.OK,
                    f"{where}: its CPUs fit in one NUMA node; the kubelet's Topology Manager "
                    "policy single-numa-node keeps a Guaranteed pod's CPUs there",
                )
            )
    return findings


def _amx(pods: Sequence[EnginePod], nodes: Mapping[str, NodeFacts]) -> list[Finding]:
    findings = []
    for pod in pods:
        node = nodes.get(pod.node)
        doctor = engine(pod.engine).doctor
        if node is None or doctor.amx_fixed_in is None:
            continue
        if True not in [node.has(flag) for flag in sorted(AMX_FLAGS)]:
            continue
        findings.append(_amx_finding(pod, doctor.amx_fixed_in))
    return findings


def _amx_finding(pod: EnginePod, fixed: Version) -> Finding:
    doctor = engine(pod.engine).doctor
    version = image_version(pod.image)
    shown = show_version(version) if version else "unknown"
    where = f"{pod.label} on AMX node {pod.node} ({doctor.title} {shown})"
    if version is not None and version >= fixed:
        return Finding("amx", Verdict.OK, f"{where}: the AMX crash is fixed in this version")
    if doctor.amx_guarded(version, pod.env, pod.commands):
        return Finding(
            "amx",
            Verdict.OK,
            f"{where}: AMX guard on ({doctor.amx_workaround(version)})",
            f"upgrading to {doctor.title} {show_version(fixed)}+ lifts the guard",
        )
    return Finding(
        "amx",
        Verdict.FAIL,
        f"{where}: no AMX guard; builds before {show_version(fixed)} crash on "
        "AMX CPUs in the AMX / flash-attention path (ollama#17205, #17006)",
        f"upgrade the image to {pod.engine} {show_version(fixed)} or later, or "
        f"{doctor.amx_workaround(version)} (a LocalModel gets this from its amx rules)",
    )


def _unknown_nodes(nodes: Mapping[str, NodeFacts]) -> list[Finding]:
    unknown = sorted(n.name for n in nodes.values() if n.cpu_flags is None)
    if not unknown:
        return [
            Finding("node-facts", Verdict.OK, f"CPU features known on all {len(nodes)} nodes")
        ]
    more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
    shown = ", ".join(unknown[:10]) + more
    return [
        Finding(
            "node-facts",
            Verdict.WARN,
            f"CPU features unknown on {len(unknown)} node{'s' if len(unknown) != 1 else ''} "
            f"(no NFD or probe labels): {shown}; the rules take their safe path there "
            "(AMX guard on whatever the CPU)",
            "enable the chart's node probe (probe.enabled=true, the default) or install "
            "Node Feature Discovery",
        )
    ]


def _loading(pods: Sequence[EnginePod], now: float | None) -> list[Finding]:
    """Engines still loading their model (their startup probe not passed yet)
    for longer than a load of their memory limit's worth of weights takes
    (podspec.expected_load_seconds: the weights are at most the limit), or than
    the startup probe's bound derived from it."""
    findings = []
    for pod in pods:
        since = _seconds(pod.loading_since)
        if now is None or since is None or not pod.memory_bytes:
            continue
        ran = now - since
        expected = expected_load_seconds(pod.memory_bytes, pod.engine)
        if ran <= expected:
            continue
        bound = startup_bound_seconds(expected)
        past = ran > bound
        findings.append(Finding(
            "loading", Verdict.FAIL if past else Verdict.WARN,
            f"{pod.label} on node {pod.node} has loaded its model for {ran:.0f} s; at most "
            f"{format_bytes(pod.memory_bytes)} of weights (its memory limit) load in about "
            f"{expected:.0f} s from a disk reading {DEFAULT_DISK_BYTES_PER_SECOND // 10**6} MB/s"
            + (f", and the startup probe's bound is {bound} s: the kubelet restarts it"
               if past else ""),
            "check the engine's threads against its CPU limit (below) and the weights "
            f"volume's read speed: kubectl logs -n {pod.namespace} {pod.name} -c {pod.container}",
        ))
    return findings


def _seconds(rfc3339: str) -> float | None:
    """An RFC 3339 time as Unix seconds (None: empty or not one)."""
    try:
        return datetime.fromisoformat(rfc3339).timestamp() if rfc3339 else None
    except ValueError:
        return None
