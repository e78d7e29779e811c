"""The gateway's wire contract has one home (localmodel.gateway_contract):

- the controller, doctor and timeline import no module of localmodel.gateway,
  directly or through another module of the package;
- the renderer names the gateway's variables, port and probe paths through the
  contract, and the variables it sets are the ones the gateway's settings
  declaration derives;
- the gateway, which runs in the pod from the operator image, reads engine
  facts by name and imports neither the engine adapters (they import the
  API and the rules' shapes) nor the renderer.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

import pytest

from localmodel import gateway_contract as contract
from localmodel.api import parse_local_model
from localmodel.commands import parse_models
from localmodel.desired import desired_state
from localmodel.engines import NAMES, SHIPPED, facts
from localmodel.facts import FactSource, NodeFacts
from tests.architecture import codebase

pytestmark = pytest.mark.unit

ROOT = codebase.ROOT
PACKAGE = codebase.PACKAGE
NOW = "2026-11-29T00:00:00Z"


@functools.cache
def imports(module: str) -> frozenset[str]:
    """The localmodel modules `module` imports (any import statement, at any
    depth: lazy imports count), a package's name standing for its __init__."""
    path = codebase.module_file(module)
    if path is None:
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(codebase.tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("localmodel")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("localmodel"):
                continue
            found.add(node.module)
            # `from package import module` imports the module too.
            found |= {
                f"{node.module}.{a.name}"
                for a in node.names
                if codebase.module_file(f"{node.module}.{a.name}") is not None
            }
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    for name in list(found):
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(2, len(parts))}
    return frozenset(found - {module})


def reached(module: str) -> set[str]:
    """Every localmodel module importing `module` ends up importing."""
    seen: set[str] = set()
    stack = [module]
    while stack:
        for other in imports(stack.pop()):
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen


def _modules_under(folder: str) -> list[str]:
    return sorted(m.name for m in codebase.under(folder))


def _is_gateway(module: str) -> bool:
    return module == "localmodel.gateway" or module.startswith("localmodel.gateway.")


def test_the_controller_doctor_and_timeline_import_no_gateway_module() -> None:
    for folder in ("controller", "doctor", "timeline"):
        modules = _modules_under(folder)
        assert modules, folder
        for module in modules:
            direct = sorted(m for m in imports(module) if _is_gateway(m))
            assert not direct, f"{module} imports {direct}: import localmodel.gateway_contract"
            through = sorted(m for m in reached(module) if _is_gateway(m))
            assert not through, f"{module} reaches {through} through the modules it imports"


def test_the_import_walk_sees_every_form_of_import() -> None:
    """The walk above is not vacuous: it finds the gateway where it is imported."""
    assert "localmodel.gateway.config" in imports("localmodel.gateway.cli")
    assert "localmodel.gateway" in imports("localmodel.gateway.cli")
    assert "localmodel.gateway_contract" in imports("localmodel.timeline.cli")
    assert any(_is_gateway(m) for m in reached("localmodel.gateway.server"))


def test_the_contract_imports_no_gateway_module_and_no_renderer() -> None:
    bad = sorted(
        m for m in reached("localmodel.gateway_contract")
        if _is_gateway(m) or m.startswith("localmodel.render")
    )
    assert not bad, bad


def test_the_gateway_imports_neither_the_engine_adapters_nor_the_renderer() -> None:
    """It runs in the pod from the operator image and asks engine facts by
    name (localmodel.engines.facts): the adapters import the API and the rules' shapes."""
    for module in _modules_under("gateway"):
        for other in sorted(reached(module)):
            assert not other.startswith("localmodel.render"), (module, other)
            assert other != "localmodel.engines.registry", (module, other)
            assert not other.endswith(".adapter"), (module, other)
        # No engine by its own module: the facts (and the timing reader,
        # localmodel.engines.timings) come by the engine's name.
        named = sorted(
            m for m in imports(module)
            if m.startswith("localmodel.engines.")
            and (PACKAGE / "engines" / m.split(".")[2]).is_dir()
        )
        assert not named, f"{module} imports {named}: ask localmodel.engines.facts(name)"


# ---- the renderer's names ---------------------------------------------------------


def _renderer_files() -> list[Path]:
    """The renderer's modules, and the engines' pod parts (which render the
    engine containers beside the gateway's)."""
    files = [m.path for m in codebase.under("render")]
    files += [m.path for m in codebase.under("engines") if m.path.name == "pod.py"]
    assert files
    return files


def _spelled(files: list[Path], literals: set[str]) -> list[str]:
    """Where the code (not its docstrings) spells one of `literals` or the
    gateway's port."""
    found = []
    for path in files:
        tree = codebase.tree(path)
        prose = codebase.docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in prose:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if isinstance(node.value, str):
                found += [f"{where}: {lit!r}" for lit in sorted(literals) if lit in node.value]
            elif type(node.value) is int and node.value == contract.GATEWAY_PORT:
                found.append(f"{where}: {node.value}")
    return found


def test_the_renderer_spells_no_gateway_variable_port_or_probe_path() -> None:
    literals = {contract.ENV_PREFIX, contract.READY_PATH, contract.HEALTH_PATH}
    spelled = _spelled(_renderer_files(), literals)
    assert not spelled, f"name them through localmodel.gateway_contract: {spelled}"


def test_the_controller_doctor_and_timeline_spell_no_gateway_variable_metric_or_port() -> None:
    """They read what the gateway serves and the renderer sets; their own
    endpoints (the operator's /metrics, /healthz) are not the gateway's."""
    files = [m.path for folder in ("controller", "doctor", "timeline")
             for m in codebase.under(folder)]
    spelled = _spelled(files, {contract.ENV_PREFIX, contract.METRIC_PREFIX})
    assert not spelled, f"name them through localmodel.gateway_contract: {spelled}"


NODE = NodeFacts(
    name="big",
    allocatable_cpu_milli=64_000,
    allocatable_memory_bytes=256 * 1024**3,
    cpu_flags=frozenset({"AVX2"}),
    source=FactSource.NFD,
)


def _example(engine: str) -> dict[str, Any]:
    """The first example LocalModel of this engine, as a manifest."""
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        if "kind: LocalModel" not in path.read_text() or path.name == "invalid.yaml":
            continue
        for lm in parse_models([str(path)]):
            if lm.spec.engine.name.value == engine:
                body = lm.model_dump(by_alias=True, exclude_none=True, mode="json")
                body.pop("status", None)
                body["spec"].pop("placement", None)
                return body
    raise AssertionError(f"no example runs {engine}")


def _gateway_container(engine: str, overflow: bool) -> dict[str, Any]:
    body = _example(engine)
    gateway: dict[str, Any] = {**body["spec"].get("gateway", {}), "enabled": True}
    if overflow:
        gateway["overflow"] = {
            "url": "https://api.example.com/v1",
            "model": "big",
            "apiKeySecretRef": {"name": "keys", "key": "k"},
        }
    body["spec"]["gateway"] = gateway
    state = desired_state([parse_local_model(body)], [NODE], now=NOW)
    pod = next(o for o in state.models[0].objects if o["kind"] == "Pod")
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "gateway"]
    return dict(container)


def test_the_variables_the_renderer_sets_are_the_ones_the_gateway_declares() -> None:
    declared = {contract.env_name(flag) for flag in contract.FLAGS}
    for engine in (f.NAME for f in SHIPPED):  # the examples run the shipped engines
        for overflow in (False, True):
            container = _gateway_container(engine, overflow)
            env = container["env"]
            assert isinstance(env, list)
            names = {e["name"] for e in env}
            secret = {e["name"] for e in env if "valueFrom" in e}
            assert names - secret <= declared, sorted(names - secret - declared)
            assert secret == ({contract.OVERFLOW_API_KEY_ENV} if overflow else set())
            plain = {e["name"]: e["value"] for e in env if "value" in e}
            assert plain[contract.env_name("engine")] == engine
            port = facts(engine).PORT
            assert plain[contract.env_name("upstream")] == f"http://127.0.0.1:{port}"
            assert plain[contract.env_name("listen")].endswith(f":{contract.GATEWAY_PORT}")
            assert plain[contract.env_name("admin-listen")].endswith(f":{contract.ADMIN_PORT}")
            assert container["ports"] == [
                {"name": "http", "containerPort": contract.GATEWAY_PORT, "protocol": "TCP"},
                {"name": "admin", "containerPort": contract.ADMIN_PORT, "protocol": "TCP"},
            ]


def test_gateway_variables_refuses_a_flag_the_gateway_does_not_declare() -> None:
    assert contract.gateway_variables({"max-queue": "3"}) == {"LOCALMODEL_GATEWAY_MAX_QUEUE": "3"}
    try:
        contract.gateway_variables({"max-queue": "3", "no-such-flag": "1"})
    except KeyError as exc:
        assert "no-such-flag" in str(exc)
    else:
        raise AssertionError("an undeclared flag was named")


def test_every_engine_has_the_facts_the_gateway_reads() -> None:
    from localmodel.api import EngineName
    from localmodel.gateway.routes import ROUTES

    assert set(NAMES) == {e.value for e in EngineName}
    paths = {r.path for r in ROUTES if r.streams}
    for name in NAMES:
        engine = facts(name)
        assert name == engine.NAME
        # The calibration calls a generation route the gateway serves: its
        # shape tells the body's.
        assert engine.CALIBRATION_PATH in paths, name


def test_each_engines_calibration_is_built_from_its_facts() -> None:
    from localmodel.engines import llama_server, ollama
    from localmodel.gateway.routes import Kind
    from localmodel.gateway.speed import CALIBRATION_PROMPT, calibration_call

    call = calibration_call(facts(ollama.NAME), "m", {"num_thread": 4}, "-1", tokens=8)
    assert (call.path, call.kind) == (ollama.GENERATE_PATH, Kind.GENERATE)
    assert call.body == {
        "model": "m", "prompt": CALIBRATION_PROMPT, "raw": True, "stream": True,
        "keep_alive": "-1",
        "options": {"num_thread": 4, "num_predict": 8, "temperature": 0, "seed": 0},
    }
    call = calibration_call(facts(llama_server.NAME), "", {"num_thread": 4}, "-1", tokens=8)
    assert (call.path, call.kind) == (llama_server.COMPLETIONS_PATH, Kind.OPENAI_COMPLETION)
    assert call.body == {
        "model": "model", "prompt": CALIBRATION_PROMPT, "max_tokens": 8, "temperature": 0,
        "seed": 0, "ignore_eos": True, "cache_prompt": False, "stream": True,
        "stream_options": {"include_usage": True},
    }
