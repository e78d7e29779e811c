"""A model's start: its expected load time (`podspec.expected_load_seconds`)
and the startup probe's bound derived from it (`startup_bound_seconds`),
as the rule decides it and the llama-server pod spells it; Ollama's pod has
no startup probe (nothing there would restart a long load)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.desired import desired_state
from localmodel.engines import llama_server, ollama
from localmodel.podspec import (
    DEFAULT_DISK_BYTES_PER_SECOND,
    STARTUP_FLOOR_SECONDS,
    STARTUP_MULTIPLE,
    STARTUP_PERIOD_SECONDS,
    expected_load_seconds,
    startup_bound_seconds,
    startup_probe_timing,
)
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

GIB = 1024**3
NOW = "2026-12-01T00:00:00Z"
SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
URL = "https://models.example/model.gguf"
NODE = MakeNode("n1").cpu_flags({"AVX2"}).memory_gib(256)
ENGINES = (llama_server.NAME, ollama.NAME)


@pytest.mark.parametrize(("expected", "bound"), [
    (0.0, 1800),        # nothing to load: the floor
    (180.0, 1800),      # 10 x 180 s is the floor exactly
    (180.1, 1805),      # just past it: rounded up to a whole probe period
    (250.0, 2500),
    (1000.0, 10000),
    (999.95, 10000),
])
def test_the_bound_is_the_multiple_of_the_expected_load_never_below_the_floor(
        expected: float, bound: int) -> None:
    assert startup_bound_seconds(expected) == bound


@pytest.mark.parametrize("engine", ENGINES)
def test_the_expected_load_is_the_fixed_cost_the_work_per_gib_and_the_read(engine: str) -> None:
    fixed = expected_load_seconds(0, engine)
    per_gib = expected_load_seconds(GIB, engine, disk_bytes_per_second=1e30) - fixed
    assert fixed > 0 and per_gib > 0
    # 4 GiB from a disk reading 100 MB/s: 4 x 1073.74 MB / 100 MB/s = 42.9 s of reading.
    assert expected_load_seconds(4 * GIB, engine, 100e6) == pytest.approx(
        fixed + 4 * per_gib + 4 * GIB / 100e6)
    # Unknown disk speed: the stated default.
    assert expected_load_seconds(4 * GIB, engine) == pytest.approx(
        expected_load_seconds(4 * GIB, engine, DEFAULT_DISK_BYTES_PER_SECOND))


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.floats(1e6, 1e10), st.floats(1e6, 1e10),
       st.sampled_from(ENGINES))
def test_bigger_weights_or_a_slower_disk_never_shorten_the_bound(
        small: int, extra: int, slow: float, faster: float, engine: str) -> None:
    fast = slow + faster
    base = startup_bound_seconds(expected_load_seconds(small, engine, fast))
    assert startup_bound_seconds(expected_load_seconds(small + extra, engine, fast)) >= base
    assert startup_bound_seconds(expected_load_seconds(small, engine, slow)) >= base


@given(st.floats(0, 1e6))
def test_the_probe_allows_the_bound_and_the_floor_holds(expected: float) -> None:
    bound = startup_bound_seconds(expected)
    assert bound >= STARTUP_FLOOR_SECONDS and bound >= STARTUP_MULTIPLE * expected
    assert bound % STARTUP_PERIOD_SECONDS == 0
    probe = startup_probe_timing(bound)
    assert probe["periodSeconds"] * probe["failureThreshold"] == bound


def test_a_tuning_without_a_decided_bound_keeps_the_floor() -> None:
    probe = startup_probe_timing(0)
    assert probe["periodSeconds"] * probe["failureThreshold"] == STARTUP_FLOOR_SECONDS


def _replica(spec: dict[str, Any], engine: str = llama_server.NAME) -> tuple[Any, Any]:
    model = (MakeLocalModel("g").spec(**spec).engine(engine).gguf(URL, SHA).cpu(2).obj())
    result = desired_state([model], [NODE.facts()], now=NOW).models[0]
    assert result.replicas, result.status.conditions
    pod = by_kind_name(result.objects)["Pod/g-0"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    return result.replicas[0].tuning, containers[engine]


def _allowed(container: dict[str, Any]) -> int:
    probe = container["startupProbe"]
    return int(probe["periodSeconds"] * probe["failureThreshold"])


def test_the_small_test_model_keeps_the_thirty_minutes_it_had() -> None:
    tuning, engine = _replica({"model": "gemma3:270m"})
    assert tuning.startup_seconds == STARTUP_FLOOR_SECONDS
    assert engine["startupProbe"]["failureThreshold"] == 360
    assert engine["startupProbe"]["periodSeconds"] == 5
    [decision] = [d for d in tuning.decisions if d.rule == "llama-server-startup-from-load-time"]
    assert "(the floor)" in decision.effect and "1800 s" in decision.effect


def test_a_large_model_gets_a_multiple_of_its_expected_load() -> None:
    info = {"weightsSize": "40Gi", "layers": 80, "kvHeads": 8}
    tuning, engine = _replica({"model": "acme/big:70b", "modelInfo": info, "context": 2048})
    expected = expected_load_seconds(40 * GIB, llama_server.NAME)
    assert expected * STARTUP_MULTIPLE > STARTUP_FLOOR_SECONDS  # 40 GiB at 50 MB/s: 859 s
    assert tuning.startup_seconds == startup_bound_seconds(expected)
    assert _allowed(engine) == tuning.startup_seconds
    [decision] = [d for d in tuning.decisions if d.rule == "llama-server-startup-from-load-time"]
    assert f"{tuning.startup_seconds} s:" in decision.effect and "40Gi" in decision.effect


def test_without_a_known_shape_the_memory_limit_bounds_the_weights_read() -> None:
    tuning, engine = _replica({"model": "acme/secret:70b", "memory": "48Gi"})
    assert tuning.startup_seconds == startup_bound_seconds(
        expected_load_seconds(48 * GIB, llama_server.NAME))
    assert _allowed(engine) == tuning.startup_seconds > STARTUP_FLOOR_SECONDS


def test_ollamas_server_has_no_startup_probe_its_load_is_the_gateways_request() -> None:
    # `ollama serve` answers before any model loads (the gateway's warm-up loads
    # it), and nothing restarts the container meanwhile: no liveness probe.
    tuning, engine = _replica({"model": "gemma3:270m"}, engine=ollama.NAME)
    assert "startupProbe" not in engine and "livenessProbe" not in engine
    assert tuning.startup_seconds == 0
