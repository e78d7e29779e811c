"""Facts decided once (issue 43): the default engine, "AMX is Ollama's", and the
`Version` alias each have one home; these fail when a second decision creeps
back in beside it.

- The default engine: `localmodel.engines.DEFAULT` (the first shipped engine);
  the API's default and the gateway's follow it.
- AMX is an engine's concern when its facts list `AMX_LIBRARIES`: the API then
  allows placement.safeCpuPath, its own rules guard AMX hosts, and its doctor
  part knows the fixed version; no other engine does any of these.
- `Version` (an engine version, a tuple of three ints): localmodel/versions.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from localmodel import engines
from localmodel.api import LocalModelSpec
from localmodel.api.engine import DEFAULT_ENGINE
from localmodel.engines import FACTS, EngineFacts
from localmodel.engines.registry import engine
from localmodel.gateway_contract import GatewayConfig
from localmodel.rules.steps import AMX_FLAGS
from localmodel.rules.table import RULES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "localmodel"
GGUF = {"url": "https://x.example/m.gguf", "sha256": "0" * 64}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def _assigned(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """(target name, value) of each assignment to a plain name, anywhere."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                yield target.id, value


# ---- the default engine ---------------------------------------------------------------


def _names_an_engine(value: ast.expr) -> bool:
    """Whether an expression picks an engine: a facts module, its name, an entry of the registry."""
    modules = {engines.package(f).rsplit(".", 1)[1] for f in FACTS}
    for node in ast.walk(value):
        if isinstance(node, ast.Name) and node.id in modules:
            return True
        if isinstance(node, ast.Constant) and node.value in engines.NAMES:
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id in ("SHIPPED", "FACTS", "NAMES"):
            return True
    return False


def test_the_default_engine_is_decided_in_one_place() -> None:
    deciding = sorted(
        f"{rel}: {name}" for rel, tree in _modules() for name, value in _assigned(tree)
        if "DEFAULT" in name and _names_an_engine(value))
    assert deciding == ["engines/__init__.py: DEFAULT"]


def test_the_api_and_the_gateway_default_to_that_engine() -> None:
    assert DEFAULT_ENGINE == engines.DEFAULT.NAME
    assert LocalModelSpec.model_validate({"model": "m"}).engine.name == engines.DEFAULT.NAME
    assert GatewayConfig().engine == engines.DEFAULT.NAME


# ---- AMX is the concern of the engines whose facts say so -------------------------------


def _amx_rules(name: str) -> list[str]:
    return [r.id for r in RULES if name in r.engines and r.cpu is not None
            and r.cpu.flags <= AMX_FLAGS]


def _safe_cpu_path_allowed(f: EngineFacts) -> bool:
    try:
        LocalModelSpec.model_validate({"model": "m", "engine": {"name": f.NAME}, "gguf": GGUF,
                                       "placement": {"safeCpuPath": True}})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("facts", FACTS, ids=lambda f: f.NAME)
def test_amx_follows_the_engine_s_facts_everywhere(facts: EngineFacts) -> None:
    concern = bool(facts.AMX_LIBRARIES)
    assert _safe_cpu_path_allowed(facts) is concern
    assert bool(_amx_rules(facts.NAME)) is concern
    assert (engine(facts.NAME).doctor.amx_fixed_in is not None) is concern


def test_an_engine_s_amx_facts_are_read_only_in_its_own_package() -> None:
    """Outside an engine's package only the registry-wide `AMX_LIBRARIES` (through
    `EngineFacts`) is read, never an engine's own AMX constants by name."""
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "localmodel.engines."):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names = [node.attr] if node.value.id in {"ollama", "llama_server"} else []
            own = (node.module or "").split(".")[2] if isinstance(node, ast.ImportFrom) \
                and len((node.module or "").split(".")) > 2 else ""
            if any(n.startswith("AMX_") for n in names) and not rel.startswith(
                    f"engines/{own}/" if own else "\0"):
                found.append(f"{rel}:{node.lineno}")
    assert found == []


# ---- the Version alias ------------------------------------------------------------------


def _is_three_ints(value: ast.expr) -> bool:
    return ast.unparse(value).replace(" ", "") == "tuple[int,int,int]"


def test_the_version_alias_has_one_home() -> None:
    homes = sorted(rel for rel, tree in _modules() for name, value in _assigned(tree)
                   if name == "Version" and _is_three_ints(value))
    assert homes == ["versions.py"]
    spelled = sorted(rel for rel, tree in _modules() if rel != "versions.py"
                     for node in ast.walk(tree)
                     if isinstance(node, ast.arg) and node.annotation is not None
                     and _is_three_ints(node.annotation))
    assert spelled == []
