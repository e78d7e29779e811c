"""doctor's checks, pure: a machine's facts and what was read from the engine (an
`EngineView`) in, findings out. No system call but the CPU affinity of this
process (`_allowed_cpus`); the reading is `localmodel.doctor.read`'s.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from localmodel import engines
from localmodel.doctor.metrics import GatewayStats
from localmodel.doctor.report import Finding, Verdict
from localmodel.engines.doctor import EngineDoctor, LoadedModel
from localmodel.engines.registry import ENGINES
from localmodel.facts.cpu import AmxKernel
from localmodel.facts.machine import MachineFacts
from localmodel.facts.quantity import format_bytes
from localmodel.facts.topology import format_cpu_list
from localmodel.podspec import (
    DEFAULT_DISK_BYTES_PER_SECOND,
    expected_load_seconds,
    startup_bound_seconds,
)
from localmodel.rules.steps import AMX_FLAGS
from localmodel.versions import parse_version, show_version

__all__ = [
    "GATEWAY",
    "EngineView",
    "budget_findings",
    "default_engine_url",
    "local_findings",
    "queue_findings",
    "speed_findings",
]

# What answered at --engine-url when it is the gateway, not an engine (`EngineView.kind`).
GATEWAY = "gateway"

# Sources for the SMT and NUMA advice (see docs/doctor.md, "Use what the probe learns").
SMT_SOURCE = (
    "llama.cpp common/common.cpp (its default thread count is the physical cores); "
    "one report of 8 cores / 16 threads: ~9 tok/s at 8 threads, ~2.5 at 16 (llama.cpp #19110, "
    "PR #20020)"
)
NUMA_SOURCE = "llama.cpp #13850 (--numa distribute ~2x on a 2-node machine)"


@dataclass(frozen=True)
class EngineView:
    """What doctor learned about the engine at one URL."""

    url: str
    kind: str | None = None  # "ollama", "llama-server", "gateway"; None = unreachable
    error: str | None = None
    version: str | None = None
    models: tuple[LoadedModel, ...] = ()
    slots: int | None = None
    context_per_slot: int | None = None
    threads: int | None = None
    threads_source: str = ""  # where ``threads`` came from, for the message
    pid: int | None = None
    process_budget: float | None = None  # the engine process's own CPU budget
    process_budget_why: str = ""
    loading: bool = False  # it answered, but is still loading its model
    gateway: GatewayStats | None = None
    weights_bytes: int | None = None  # the model file its command line names, when local
    running_seconds: float | None = None  # how long its process has run, when local


def default_engine_url(env: Mapping[str, str] = os.environ) -> str:
    """The default engine's address variable as its clients read it (Ollama's
    ``OLLAMA_HOST``: ``host:port``, scheme optional), else its port on loopback."""
    engine = engines.DEFAULT
    host = env.get(engine.HOST_ENV, "").strip() if engine.HOST_ENV else ""
    if not host:
        return f"http://127.0.0.1:{engine.PORT}"
    if "://" not in host:
        host = "http://" + host
    parsed = urllib.parse.urlsplit(host)
    hostname = parsed.hostname or "127.0.0.1"
    if hostname == "0.0.0.0":
        hostname = "127.0.0.1"
    port = parsed.port or engine.PORT
    return f"{parsed.scheme}://{hostname}:{port}"


def _doctor(engine: EngineView) -> EngineDoctor | None:
    """The doctor part of the engine that answered (None: a gateway, or nothing)."""
    adapter = ENGINES.get(engine.kind or "")
    return adapter.doctor if adapter is not None else None


# ---- pure checks -----------------------------------------------------------


def budget_findings(machine: MachineFacts) -> list[Finding]:
    """The CPU budget against the host's CPUs, and the AMX state."""
    node = machine.node
    budget = machine.cpu_budget
    parts = [f"{machine.host_cpus} host CPUs"]
    if node.cpuset_cpus is not None and node.cpuset_cpus < machine.host_cpus:
        parts.append(f"cpuset of {node.cpuset_cpus}")
    if node.cgroup_cpu_quota is not None:
        parts.append(f"cgroup quota {node.cgroup_cpu_quota:g} CPUs")
    whole = max(1, int(budget))
    findings = [
        Finding(
            "cpu-budget",
            Verdict.OK,
            f"CPU budget {budget:g} ({', '.join(parts)}): an engine here should run "
            f"{whole} thread{'s' if whole != 1 else ''}"
            + (
                "; engines that count host CPUs (llama.cpp's default, Ollama on cgroup v1 "
                f"or a cpuset) would start {machine.host_cpus}"
                if whole < machine.host_cpus
                else ""
            ),
        )
    ]
    findings.extend(_amx_findings(machine))
    return findings


def _amx_findings(machine: MachineFacts) -> list[Finding]:
    flags = machine.node.cpu_flags
    if flags is None:
        return [Finding("amx", Verdict.WARN, "CPU flags unknown (no /proc/cpuinfo flags line)",
                        "run where /proc/cpuinfo is readable")]
    present = sorted(AMX_FLAGS & flags)
    kernel = machine.amx_kernel
    offered = {
        AmxKernel.OFFERED: "the kernel offers AMX to user space (arch_prctl XCOMP_SUPP has "
        "XTILEDATA)",
        AmxKernel.NOT_OFFERED: "the kernel does not offer AMX to user space",
        AmxKernel.NO_XCOMP: "the kernel has no arch_prctl AMX permission call (before 5.16)",
        AmxKernel.NOT_X86: "not an x86 CPU",
    }.get(kernel, "the kernel's AMX offer was not checked") if kernel else (
        "the kernel's AMX offer was not checked"
    )
    if present:
        return [Finding("amx", Verdict.OK, f"AMX CPU ({', '.join(present)}); {offered}")]
    return [Finding("amx", Verdict.OK, f"no AMX flags in /proc/cpuinfo; {offered}")]


def _engine_budget(machine: MachineFacts, engine: EngineView) -> tuple[float, str]:
    if engine.process_budget is not None:
        return engine.process_budget, engine.process_budget_why
    return machine.cpu_budget, "this process's budget (the engine's process was not found)"


def local_findings(machine: MachineFacts, engine: EngineView | None) -> list[Finding]:
    """Every finding for one machine, in the field's order."""
    if engine is None:
        return [*budget_findings(machine)]
    if engine.kind is None:
        return [
            Finding(
                "engine",
                Verdict.WARN,
                f"no engine answered at {engine.url}: {engine.error}",
                "pass --engine-url (Ollama's OLLAMA_HOST, or a llama-server URL)",
            ),
            *budget_findings(machine),
        ]
    if engine.loading:
        return [
            _loading_finding(engine),
            *budget_findings(machine),
            *_thread_findings(machine, engine),
        ]
    findings = _held_findings(engine)  # 1. models holding weights
    findings += _local_queue_findings(engine)  # 2. callers that can queue
    if engine.kind != GATEWAY:  # 3. cancellation
        findings.append(
            Finding(
                "cancellation",
                Verdict.WARN,
                f"{engine.url} is the engine itself, not the gateway: a timed-out non-streaming "
                "call may keep running and hold a slot",
                f"put `localmodel gateway --upstream {engine.url} --engine {engine.kind}` "
                "in front and send callers there",
            )
        )
    # 4. speed, last
    findings.extend(budget_findings(machine))
    findings.extend(_thread_findings(machine, engine))
    if engine.gateway is not None:
        findings.extend(speed_findings(engine.url, engine.gateway))
    findings.extend(_amx_engine_findings(machine, engine))
    return findings


def _loading_finding(engine: EngineView) -> Finding:
    """A loading engine, against the load the operator expects of its model
    (podspec.expected_load_seconds, the startup probe's bound derived from it)."""
    doctor = _doctor(engine)
    sign = doctor.loading_sign if doctor is not None else "it says so"
    message = f"{engine.kind} at {engine.url} is still loading its model ({sign})"
    fix = "wait for it to load; check the threads against the CPU budget below"
    weights, ran = engine.weights_bytes, engine.running_seconds
    if not weights or engine.kind not in engines.NAMES:
        return Finding("engine", Verdict.WARN, message + "; a load that takes minutes is "
                       "what oversubscribed threads do", fix)
    expected = expected_load_seconds(weights, engine.kind)
    bound = startup_bound_seconds(expected)
    message += (f"; {format_bytes(weights)} of weights load in about {expected:.0f} s from a "
                f"disk reading {DEFAULT_DISK_BYTES_PER_SECOND // 10**6} MB/s (the operator's "
                f"pods allow {bound} s)")
    if ran is None or ran <= expected:
        return Finding("engine", Verdict.WARN, message, fix)
    message += f", and it has run {ran:.0f} s"
    if ran > bound:
        return Finding("engine", Verdict.FAIL, message + ": past the startup probe's bound, a "
                       "pod's engine would have been restarted", fix + " and the disk's speed")
    return Finding("engine", Verdict.WARN, message + ": slower than expected (oversubscribed "
                   "threads, or a disk slower than that)", fix + " and the disk's speed")


def _held_findings(engine: EngineView) -> list[Finding]:
    if len(engine.models) > 1:
        held = ", ".join(
            f"{m.name} ({format_bytes(m.size_bytes) if m.size_bytes else '? bytes'}"
            f"{f', context {m.context}' if m.context else ''})"
            for m in engine.models
        )
        return [
            Finding(
                "models-per-node",
                Verdict.WARN,
                f"{len(engine.models)} models hold weights in {engine.kind} at {engine.url}: {held}"
                ": they split memory and cores",
                "keep one model loaded (OLLAMA_MAX_LOADED_MODELS=1), or one engine per model",
            )
        ]
    names = ", ".join(m.name for m in engine.models) or "none loaded"
    return [
        Finding("models-per-node", Verdict.OK, f"{engine.kind} at {engine.url} holds: {names}")
    ]


def _local_queue_findings(engine: EngineView) -> list[Finding]:
    if engine.gateway is not None:
        timeline = f"localmodel timeline NAME --gateway-url {engine.url}"
        return queue_findings(engine.url, engine.gateway, timeline)
    if engine.slots is None:
        return []
    ctx = f", context {engine.context_per_slot} per slot" if engine.context_per_slot else ""
    return [
        Finding(
            "queue",
            Verdict.OK,
            f"{engine.kind} has {engine.slots} parallel slot{'s' if engine.slots != 1 else ''}"
            f"{ctx}; its queue is not visible without the gateway",
        )
    ]


def _thread_findings(machine: MachineFacts, engine: EngineView) -> list[Finding]:
    budget, why = _engine_budget(machine, engine)
    want = max(1, int(budget))
    doctor = _doctor(engine)
    if engine.threads is None:
        default = machine.topology.physical_cores or machine.host_cpus
        unset = doctor.unset_threads(default, want) if doctor is not None else None
        if unset is not None and engine.pid is not None:
            return [
                Finding(
                    "threads",
                    Verdict.FAIL if default > want else Verdict.WARN,
                    f"{unset[0]} on a CPU budget of {budget:g} ({why})",
                    unset[1],
                )
            ]
        return [
            Finding(
                "threads",
                Verdict.WARN,
                f"{engine.kind}: the thread count it uses is not visible "
                f"({engine.threads_source or 'no Modelfile num_thread, no local process'}); "
                f"CPU budget {budget:g}",
                f"set PARAMETER num_thread {want} in the Modelfile (or options.num_thread)",
            )
        ]
    threads = engine.threads
    if threads > budget:
        return [
            Finding(
                "threads",
                Verdict.FAIL,
                f"{engine.kind} runs {threads} threads ({engine.threads_source}) on a CPU budget "
                f"of {budget:g} ({why}): oversubscribed decode collapses (ggml's barrier "
                "busy-waits)",
                doctor.local_threads_fix(want) if doctor is not None else f"use {want} threads",
            )
        ]
    findings = [
        Finding(
            "threads",
            Verdict.OK if threads == want else Verdict.WARN,
            f"{engine.kind} runs {threads} threads ({engine.threads_source}) on a CPU budget of "
            f"{budget:g} ({why})",
            "" if threads == want else f"use {want} threads: the budget allows it",
        )
    ]
    findings.extend(_smt_numa_findings(machine, threads))
    return findings


def _smt_numa_findings(machine: MachineFacts, threads: int) -> list[Finding]:
    """Advice from the topology; never a failure (the effect varies by CPU)."""
    topo = machine.topology
    found: list[Finding] = []
    allowed = _allowed_cpus(machine)
    if topo.threads_per_core and topo.threads_per_core > 1 and topo.cores:
        cores = [c for c in topo.cores if c & allowed] if allowed else list(topo.cores)
        if threads > len(cores):
            found.append(
                Finding(
                    "smt",
                    Verdict.WARN,
                    f"{threads} threads on {len(cores)} physical cores ({topo.threads_per_core} "
                    f"hardware threads per core): SMT siblings share a core's units "
                    f"({SMT_SOURCE})",
                    f"measure decode at {len(cores)} threads against {threads} on this CPU "
                    "and keep the faster",
                )
            )
    if len(topo.numa_nodes) > 1 and allowed:
        spanned = sorted(n for n, cpus in topo.numa_nodes.items() if cpus & allowed)
        if len(spanned) > 1:
            found.append(
                Finding(
                    "numa",
                    Verdict.WARN,
                    f"the CPUs this process may use ({format_cpu_list(allowed)}) span NUMA nodes "
                    f"{', '.join(map(str, spanned))}: weights in one node's memory are read "
                    f"across the interconnect ({NUMA_SOURCE})",
                    "run on one NUMA node's CPUs (numactl --cpunodebind=N --membind=N; in "
                    "Kubernetes the kubelet's Topology Manager policy single-numa-node), or "
                    "llama-server --numa distribute",
                )
            )
    return found


def _allowed_cpus(machine: MachineFacts) -> frozenset[int]:
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is None or machine.node.cpuset_cpus is None:
        return frozenset()
    try:
        return frozenset(getaffinity(0))
    except OSError:
        return frozenset()


def _amx_engine_findings(machine: MachineFacts, engine: EngineView) -> list[Finding]:
    flags = machine.node.cpu_flags or frozenset()
    doctor = _doctor(engine)
    if not AMX_FLAGS & flags or doctor is None or doctor.amx_fixed_in is None:
        return []
    fixed = doctor.amx_fixed_in
    version = parse_version(engine.version)
    if version is not None and version >= fixed:
        return []
    seen = engine.version or "unknown"
    return [
        Finding(
            "amx",
            Verdict.FAIL,
            f"{doctor.title} {seen} on an AMX CPU: builds before {show_version(fixed)} crash "
            "in the AMX / flash-attention path (ollama#17205)",
            f"upgrade to {doctor.title} {show_version(fixed)} or later, or "
            f"{doctor.amx_workaround(version)}",
        )
    ]


def queue_findings(where: str, stats: GatewayStats, timeline: str = "") -> list[Finding]:
    """Queue depth, busy slots, background turned away, foreground waiting
    (`timeline`: the command that shows whom they waited behind)."""
    seen = (
        f"{where}: {stats.slots_busy}/{stats.slots} slots busy, "
        f"{stats.queued_foreground} foreground waiting, "
        f"{stats.rejected_background} background turned away (429), "
        f"{stats.rejected_queue_full} turned away with a full queue (503)"
    )
    if stats.queued_foreground or stats.rejected_queue_full:
        return [
            Finding(
                "queue",
                Verdict.WARN,
                seen,
                "callers wait for a slot: add replicas (spec.replicas) or slots (spec.slots, "
                "with memory for their context), or mark batch callers X-Priority: background"
                + (f"; `{timeline}` shows whom they waited behind" if timeline else ""),
            )
        ]
    if stats.rejected_background:
        return [
            Finding(
                "queue",
                Verdict.OK,
                seen + ": background callers back off while people are served",
            )
        ]
    return [Finding("queue", Verdict.OK, seen)]


def speed_findings(where: str, stats: GatewayStats) -> list[Finding]:
    if stats.decode_tps is None and stats.prefill_tps is None:
        return [Finding("speed", Verdict.OK, f"{where}: no generation measured yet")]
    parts = []
    if stats.decode_tps is not None:
        parts.append(f"decode {stats.decode_tps:.1f} tok/s")
    if stats.prefill_tps is not None:
        parts.append(f"prefill {stats.prefill_tps:.1f} tok/s")
    share = (
        stats.prefill_seconds / stats.slot_busy_seconds if stats.slot_busy_seconds > 0 else None
    )
    if share is not None:
        parts.append(
            f"{stats.prefill_seconds:.1f} s of {stats.slot_busy_seconds:.1f} s slot time "
            f"re-reading prompts ({share:.0%})"
        )
    heavy = share is not None and share > 0.5
    return [
        Finding(
            "speed",
            Verdict.WARN if heavy else Verdict.OK,
            f"{where}: " + ", ".join(parts),
            "most slot time goes to prompt evaluation: keep the model loaded (keepAlive -1) "
            "and send a stable prompt prefix so the engine reuses its cache"
            if heavy
            else "",
        )
    ]
