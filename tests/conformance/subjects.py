"""The conformance suite's subjects: every engine the registry holds (the
shipped ones and every test-only package under tests/engines/, which
tests/conftest.py registers for the session), and what the suite renders of
each: one model, the same for every engine, in a few scenarios that between
them make every rule of the table fire for the engines it is for.

Nothing here names an engine: what an engine allows (spec.gguf required,
safeCpuPath, keepAlive) is read from its facts, so a new engine gets the
suite for free (tests/conformance/README.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from localmodel.desired import DesiredState, desired_state
from localmodel.engines import EngineFacts, facts
from localmodel.engines.adapter import Engine
from localmodel.engines.registry import ENGINES
from localmodel.facts import NodeFacts
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel, MakeNode

NOW = "2026-01-01T00:00:00Z"
ROOT = Path(__file__).resolve().parents[2]
# Test-only engines live here, one package each (tests/engines/__init__.py).
TEST_ENGINES = ROOT / "tests" / "engines"
NAMES: tuple[str, ...] = tuple(sorted(ENGINES))

AMX_FLAGS = ("AVX2", "AVX512F", "AMXTILE", "AMXBF16", "AMXINT8")
NODE = MakeNode("node-a").cpus(8).memory_gib(32).cpu_flags(["AVX2", "AVX512F"])


def adapter(name: str) -> Engine:
    return ENGINES[name]


def engine_facts(name: str) -> EngineFacts:
    return facts(name)


def package_dir(name: str) -> Path:
    """The folder of the engine's package (its facts module's)."""
    module: ModuleType = facts(name)  # type: ignore[assignment]
    assert module.__file__ is not None
    return Path(module.__file__).resolve().parent


def is_test_only(name: str) -> bool:
    """A package under tests/engines/: its golden lives in its own folder."""
    return package_dir(name).is_relative_to(TEST_ENGINES)


def base_model(name: str) -> MakeLocalModel:
    """The suite's model for engine `name`: a catalog model (so memory is
    sized), a GGUF (which every engine takes; some require it), 2 CPUs, two
    slots of 4096 tokens."""
    return (MakeLocalModel("conformance").model("gemma3:270m").engine(name).gguf()
            .cpu(2).context(4096).spec(slots=2))


@dataclass(frozen=True)
class Scenario:
    """One way to render the suite's model: spec changes and the node."""

    name: str
    spec: dict[str, Any]
    node: MakeNode = NODE
    engine: dict[str, Any] | None = None  # spec.engine fields besides the name
    safe_cpu_path: bool = False  # only for engines with AMX libraries to guard

    def applies_to(self, name: str) -> bool:
        return not self.safe_cpu_path or bool(facts(name).AMX_LIBRARIES)

    def model(self, name: str) -> MakeLocalModel:
        made = base_model(name).spec(**self.spec)
        if self.engine:
            made = made.engine(name, **self.engine)
        if self.safe_cpu_path:
            made = made.spec(placement={"safeCpuPath": True})
        return made


# Between them these make every rule of the table fire for every engine it
# is for (test_conformance_tuning.py fails naming a rule none fires).
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("default", {}),
    Scenario("kv-cache-q8", {"kvCache": "q8_0"}),
    Scenario("kv-cache-q8-amx-old-version", {"kvCache": "q8_0"}, NODE.cpu_flags(AMX_FLAGS),
             engine={"version": "0.5.7"}),
    Scenario("memory-and-storage-from-spec", {"memory": "6Gi", "storage": {"size": "20Gi"}}),
    Scenario("no-gateway", {"gateway": {"enabled": False}}),
    Scenario("cgroup-quota-below-cpu", {}, NODE.with_facts(cgroup_cpu_quota=1.0)),
    Scenario("amx-old-version", {}, NODE.cpu_flags(AMX_FLAGS), engine={"version": "0.5.7"}),
    Scenario("amx-mid-version", {}, NODE.cpu_flags(AMX_FLAGS), engine={"version": "0.31.0"}),
    Scenario("amx-safe-path", {}, NODE.cpu_flags(AMX_FLAGS), safe_cpu_path=True),
    # Weights whose expected load passes the startup probe's floor (podspec).
    Scenario("large-weights", {"model": "acme/large:32b", "modelInfo": {
        "weightsSize": "24Gi", "layers": 8, "kvHeads": 1}}),
)


def scenarios(name: str) -> tuple[Scenario, ...]:
    return tuple(s for s in SCENARIOS if s.applies_to(name))


@dataclass(frozen=True)
class Rendered:
    """One model rendered on one node: the objects by kind, and its status."""

    state: DesiredState

    @property
    def result(self) -> Any:
        [result] = self.state.models
        return result

    def objects(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.result.objects if o["kind"] == kind]

    @property
    def pod(self) -> dict[str, Any]:
        [pod] = self.objects("Pod")
        return pod

    @property
    def status(self) -> dict[str, Any]:
        dumped: dict[str, Any] = self.result.status.model_dump(
            mode="json", by_alias=True, exclude_none=True)
        return dumped

    def decisions(self) -> dict[str, str]:
        """Rule id -> effect, of the one replica."""
        [replica] = self.status["placements"]
        return {d["rule"]: d["effect"] for d in replica["decisions"]}

    def text(self) -> str:
        """What the pods run with, as one text: the Pod, its ConfigMap and its
        claim (every object a decision may be spelled in)."""
        kinds = ("Pod", "ConfigMap", "PersistentVolumeClaim")
        return json.dumps([o for k in kinds for o in self.objects(k)], sort_keys=True)


def render(model: MakeLocalModel, node: MakeNode = NODE,
           options: RenderOptions | None = None) -> Rendered:
    return Rendered(desired_state([model.obj()], [node.facts()], now=NOW, options=options))


def render_on(model: MakeLocalModel, nodes: list[NodeFacts],
              options: RenderOptions | None = None) -> DesiredState:
    return desired_state([model.obj()], nodes, now=NOW, options=options)
