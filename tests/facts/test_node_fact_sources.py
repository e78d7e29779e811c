"""NFD labels first, then the probe's; a node with neither is unknown, and the
rules take their safe path there and say so (through the whole desired state)."""

from __future__ import annotations

import pytest

from localmodel.desired import desired_state
from localmodel.facts import FactSource
from localmodel.facts.node import from_node
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

PRE_FIX = "docker.io/ollama/ollama:0.31.0"  # affected by the AMX crash
# Its guard: remove the crashing CPU variant (docs/engine-facts.md#amx).
GUARD = "amx-remove-cpu-variant"


NFD_NO_AMX = {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
PROBE_AMX = {
    "localmodel.dev/cpu-flags-known": "true",
    "localmodel.dev/cpu.AVX2": "true",
    "localmodel.dev/cpu.AMXTILE": "true",
    "localmodel.dev/cpu-physical-cores": "8",
    "localmodel.dev/cpu-threads-per-core": "2",
}
PROBE_NO_AMX = {"localmodel.dev/cpu-flags-known": "true", "localmodel.dev/cpu.AVX2": "true"}


@pytest.mark.parametrize(
    ("labels", "source", "amx", "guarded", "says_unknown"),
    [
        ({**NFD_NO_AMX, **PROBE_AMX}, FactSource.NFD, False, False, False),  # NFD wins
        (PROBE_AMX, FactSource.PROBE, True, True, False),
        (PROBE_NO_AMX, FactSource.PROBE, False, False, False),
        ({}, FactSource.NONE, None, True, True),  # neither: unknown, safe path, said so
    ],
)
def test_fact_source_order_and_the_safe_path(
    labels: dict[str, str], source: FactSource, amx: bool | None, guarded: bool,
    says_unknown: bool,
) -> None:
    facts = from_node(MakeNode("n1").hostname_label().labels(labels).manifest())
    assert facts.source is source
    assert facts.has("AMXTILE") is amx
    if PROBE_AMX.items() <= labels.items():
        assert (facts.physical_cores, facts.threads_per_core) == (8, 2)  # topology: probe only
    model = MakeLocalModel("m").namespace("ns").cpu(4).spec(engine={"image": PRE_FIX}).obj()
    [result] = desired_state([model], [facts], now="2026-12-01T00:00:00Z").models
    [replica] = result.replicas
    decisions = {d.rule: d.effect for d in replica.tuning.decisions}
    assert (GUARD in decisions) is guarded
    if guarded:
        assert replica.tuning.remove_libraries == ("/usr/lib/ollama/libggml-cpu-sapphirerapids.so",)
    unknown_note = "CPU features unknown on this node (no NFD or probe labels)"
    assert (unknown_note in decisions.get(GUARD, "")) is says_unknown
