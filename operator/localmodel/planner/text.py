"""How the planner words quantities, taints and demands in reasons and messages."""

from __future__ import annotations

from localmodel.facts import Taint
from localmodel.planner.model import ModelDemand


def gib(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


def need_cpu_text(d: ModelDemand) -> str:
    need = str(d.cpu.least)
    if d.overhead_cpu_milli:
        return f"{need} whole after {d.overhead_cpu_milli}m for sidecars"
    return need


def demand_text(d: ModelDemand) -> str:
    n = d.cpu.count
    cpu = "cpu: node" if n is None else f"{n} CPU{'' if n == 1 else 's'}"
    if d.overhead_cpu_milli:
        cpu += f" + {d.overhead_cpu_milli}m"
    return f"{cpu}, {gib(d.memory_bytes)}"
