"""The package's layers, declared once and checked: no import points up a layer.

`LAYERS` lists operator/localmodel's layers bottom to top, each as patterns of
module names. A module may import its own layer and the layers below it; an
import that points up fails here. Every import counts: at module level, inside
a function, and under `if TYPE_CHECKING:` (a type that points up is a
dependency that points up). Not counted: a submodule import also runs its
parent packages' `__init__` (import-linter does not count that either), and
`cli.COMMANDS` names its commands' modules as strings (cli is the top layer,
so they all point down).

The programs' layer is *independent*: its rooms (the operator, the slot gate,
doctor, timeline, the probe) import none of each other; what two of them share
lives in a lower layer. `ALLOWED` lists the rooms that still import another,
each with what ends it; an entry no import needs any more fails too, so the
list only shrinks.

The engines and the rules are layered without a way back: each engine's facts
sit at the bottom (the API reads them); the rules' shapes (`rules/model.py`,
and the steps engines' own rules share, `rules/steps.py`) and the pod pieces
(`podspec.py`, which the renderer writes too) below the engine adapters, which
spell a rule's decision and declare their own rules; the registry above the
adapters (it finds them); the rules table and evaluator above the registry
(they ask it for each engine's adapter and own rules).

No import cycle anywhere, within a layer or a room too: the strongly connected
components of the module import graph (every import counted as above) are
single modules. A cycle is two modules a reader must hold in mind at once, and
a layer check alone cannot see one inside a layer. `KNOWN_CYCLES` lists the
cycles another change is removing, each with what ends it; an entry no cycle
needs any more fails too, so the list only shrinks.

A pattern is a dotted module name where `*` stands for one name and a trailing
`**` for any number of names (none included). A module belongs to the pattern
that matches it with the most literal names: `localmodel.engines.*` (each
engine's facts, at the bottom) yields `localmodel.engines.registry` to the
registry's exact name (a new module beside them lands with the facts until it is
named there, and fails here as soon as it imports above the foundation). A
module no pattern matches fails: declare it.

Why here and not in a module of the package: this check is the declaration's
only reader, so the package ships no data that nothing runs, and a failure
points at the file where the line to add or change is.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit

ROOT = codebase.ROOT
PACKAGE = codebase.PACKAGE


@dataclass(frozen=True)
class Layer:
    name: str
    holds: str  # what lives here, and why it sits where it does
    rooms: tuple[str, ...]  # module-name patterns
    independent: bool = False  # its rooms import none of each other


LAYERS = (
    Layer("foundation",
          "the words everything shares, importing nothing above: the API group and version, "
          "errors, settings, the contracts the renderer writes and the gateway speaks, "
          "quantities, strings made printable, the engine Version alias, each engine's facts "
          "(data the API reads) and the facts registry that finds them, and each engine's "
          "timing reader (what the gateway reads of its answers) and the lookup that finds it",
          ("localmodel", "localmodel.errors", "localmodel.settings", "localmodel.contract",
           "localmodel.gateway_contract", "localmodel.gateway_contract.*",
           "localmodel.facts.quantity", "localmodel.printable",
           "localmodel.images", "localmodel.versions",
           "localmodel.engines", "localmodel.engines.*", "localmodel.engines.*.timing")),
    Layer("api",
          "the LocalModel API: spec, status, cross-field rules, parsing; the CRD made from it",
          ("localmodel.api.**", "localmodel.crd")),
    Layer("facts",
          "what is known of nodes, this machine, pods and models (the catalog)",
          ("localmodel.facts.**", "localmodel.catalog")),
    Layer("cpus",
          "how many CPUs a replica asks for and gets (planner/cpus.py): the planner decides, "
          "the rules read the decision",
          ("localmodel.planner.cpus",)),
    Layer("rule shapes",
          "what a rule and its outcome are (rules/model.py) and the steps engines' own rules "
          "share (rules/steps.py): the engine adapters spell them and declare their own rules",
          ("localmodel.rules.model", "localmodel.rules.steps")),
    Layer("pod pieces",
          "the pieces of a pod manifest the renderer and the engine adapters both write "
          "(podspec.py)",
          ("localmodel.podspec",)),
    Layer("engine adapters",
          "each engine's adapter (its pod, tuning and doctor parts composed; engines/adapter.py), "
          "its own rules (engines/<name>/rules.py) and the parts' shared modules",
          ("localmodel.engines.adapter", "localmodel.engines.pod", "localmodel.engines.tuning",
           "localmodel.engines.doctor", "localmodel.engines.gguf", "localmodel.engines.*.*")),
    Layer("registry",
          "every engine's adapter and own rules, found from the engines' facts: what the rules, "
          "the renderer and doctor ask; which pods run an engine (engine_pods: doctor, timeline "
          "and kubectl read it)",
          ("localmodel.engines.registry", "localmodel.engine_pods")),
    Layer("rules", "the tuning rules: the engine-neutral ones and each registered engine's, "
          "in order; evaluation; docs",
          ("localmodel.rules.**",)),
    Layer("planner", "placement: models x nodes x current placements -> a plan",
          ("localmodel.planner.**",)),
    Layer("outputs",
          "what a pass writes: the manifests (render), the status and its Events, the speed "
          "verdicts the status carries (with the decode ceiling they are judged against) and the "
          "reader of a replica's /speed answer that yields them (gateway_contract.speed_answer, "
          "which the operator and the router share), and the idle core (idle/: sleep, wake, who "
          "yields; it asks the planner whether a node fits)",
          ("localmodel.render.**", "localmodel.status", "localmodel.events",
           "localmodel.speed", "localmodel.ceiling", "localmodel.gaps",
           "localmodel.gateway_contract.speed_answer", "localmodel.idle_status",
           "localmodel.idle.**")),
    Layer("desired",
          "the pass over every model (validation, planner, rules, render, status), the "
          "incremental layer beside it, and the admin's policy over tenants (tenancy)",
          ("localmodel.desired.**", "localmodel.incremental.**", "localmodel.tenancy")),
    Layer("shell",
          "what the programs use to reach the world and no pure layer may: Kubernetes clients, "
          "the Prometheus text format, reading manifest files",
          ("localmodel.kube", "localmodel.metrics", "localmodel.manifest")),
    Layer("programs",
          "the programs, side by side: the operator, the slot gate, doctor, timeline, the "
          "node probe, the router",
          ("localmodel.controller.**", "localmodel.gateway.**", "localmodel.doctor.**",
           "localmodel.timeline.**", "localmodel.probe.**", "localmodel.router.**"),
          independent=True),
    Layer("commands", "the `localmodel` command and the kubectl plugin (what it prints from "
          "the objects read, kubectl_views, reads doctor's metrics: above the programs)",
          ("localmodel.cli", "localmodel.commands", "localmodel.kubectl",
           "localmodel.kubectl_views")),
)

# (importer's room, imported room): the programs that still import another, and what ends it.
ALLOWED: dict[tuple[str, str], str] = {}


# The cycles another change is removing (each a frozenset of module names), and what ends it.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


# ---- the checker ------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    layer: int  # index in LAYERS
    room: str  # the pattern that claimed the module


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def _matches(pattern: str, module: str) -> bool:
    want, have = pattern.split("."), module.split(".")
    if want[-1] == "**":
        want = want[:-1]
        have = have[: len(want)] if len(have) >= len(want) else have
    if len(want) != len(have):
        return False
    return all(w in ("*", h) for w, h in zip(want, have, strict=True))


def _literal_names(pattern: str) -> int:
    return sum(1 for part in pattern.split(".") if part not in ("*", "**"))


def place(module: str, layers: tuple[Layer, ...] = LAYERS) -> Place | str:
    """The module's layer and room, or why it has none (undeclared, ambiguous)."""
    found = [(_literal_names(p), i, p) for i, layer in enumerate(layers) for p in layer.rooms
             if _matches(p, module)]
    if not found:
        return f"{module} is in no layer: declare it in tests/architecture/test_layers.py LAYERS"
    best = max(score for score, _, _ in found)
    top = [(i, p) for score, i, p in found if score == best]
    if len(top) > 1:
        return f"{module} matches {', '.join(p for _, p in top)} alike: make one more specific"
    return Place(*top[0])


def read_package(package: Path = PACKAGE) -> dict[str, tuple[str, bool]]:
    """Module name -> (its source, whether it is a package's __init__)."""
    return {m.name: (m.text, m.is_package) for m in codebase.modules(package)}


def _resolve(name: str, modules: Mapping[str, object]) -> str | None:
    """The module `name` is, or lies in (the longest module prefix), if it is ours."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports(module: str, source: str, is_package: bool,
            modules: Mapping[str, object]) -> Iterator[Import]:
    """Every import of one of `modules` anywhere in `source`, relative ones resolved."""
    for node in _import_nodes(source):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".") if is_package else module.split(".")[:-1]
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # `from package import submodule` imports the submodule; else the module.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                yield Import(module, target, node.lineno)


@functools.cache
def _import_nodes(source: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    return tuple(n for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.Import | ast.ImportFrom))


def check(sources: Mapping[str, tuple[str, bool]], layers: tuple[Layer, ...] = LAYERS,
          allowed: Mapping[tuple[str, str], str] = ALLOWED) -> list[str]:
    """What is wrong: undeclared modules, imports that point up a layer or across
    an independent layer's rooms, and allowances no import needs any more."""
    places = {m: place(m, layers) for m in sources}
    wrong = sorted(p for p in places.values() if isinstance(p, str))
    seen: set[tuple[str, str]] = set()
    for module, (source, is_package) in sorted(sources.items()):
        for imp in imports(module, source, is_package, sources):
            here, there = places[imp.importer], places[imp.imported]
            if not isinstance(here, Place) or not isinstance(there, Place):
                continue
            where = f"{imp.importer}:{imp.line} ({layers[here.layer].name})"
            if there.layer > here.layer:
                wrong.append(f"{where} imports {imp.imported} "
                             f"({layers[there.layer].name}): a layer above")
            elif (there.layer == here.layer and layers[here.layer].independent
                  and there.room != here.room):
                pair = (here.room, there.room)
                seen.add(pair)
                if pair not in allowed:
                    wrong.append(f"{where} imports {imp.imported}: another room of an "
                                 "independent layer")
    wrong += [f"ALLOWED {a} -> {b}: no such import any more; remove it"
              for a, b in sorted(set(allowed) - seen)]
    return wrong


def graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (every import counted)."""
    return {module: {imp.imported for imp in imports(module, source, is_package, sources)}
            for module, (source, is_package) in sources.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's,
    without recursion: the package is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            step = next(todo, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(edges.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def check_cycles(sources: Mapping[str, tuple[str, bool]],
                 known: Mapping[frozenset[str], str] = KNOWN_CYCLES) -> list[str]:
    """Each import cycle not in `known`, and each entry of `known` no cycle needs."""
    found = cycles(graph(sources))
    wrong = [f"import cycle: {' <-> '.join(sorted(c))}" for c in found if c not in known]
    wrong += [f"KNOWN_CYCLES {' <-> '.join(sorted(c))}: no such cycle any more; remove it"
              for c in known if c not in found]
    return sorted(wrong)


# ---- the tree ----------------------------------------------------------------------


def test_no_import_points_up_a_layer() -> None:
    assert check(read_package()) == []


def test_no_import_cycle() -> None:
    assert check_cycles(read_package()) == []


def test_each_layer_is_described_and_each_pattern_declared_once() -> None:
    patterns = [p for layer in LAYERS for p in layer.rooms]
    assert len(patterns) == len(set(patterns))
    assert all(layer.holds for layer in LAYERS)
    assert len({layer.name for layer in LAYERS}) == len(LAYERS)


# Modules other helpers of issue 29 are making: each lands where it belongs.
@pytest.mark.parametrize(("module", "layer"), [
    ("localmodel.engines.ollama", "foundation"),
    ("localmodel.engines.llama_server", "foundation"),
    ("localmodel.engines.registry", "registry"),
    ("localmodel.engines.ollama.rules", "engine adapters"),
    ("localmodel.rules.steps", "rule shapes"),
    ("localmodel.podspec", "pod pieces"),
    ("localmodel.versions", "foundation"),
    ("localmodel.engines.pod", "engine adapters"),
    ("localmodel.engines.ollama.pod", "engine adapters"),
    ("localmodel.engines.llama_server.tuning", "engine adapters"),
    ("localmodel.gateway_contract", "foundation"),
    ("localmodel.facts.quantity", "foundation"),
    ("localmodel.facts.node", "facts"),
    ("localmodel.rules.model", "rule shapes"),
    ("localmodel.rules.table", "rules"),
    ("localmodel.rules", "rules"),
    ("localmodel.engines.gguf", "engine adapters"),
    ("localmodel.api.rules", "api"),
    ("localmodel.planner.assign", "planner"),
    ("localmodel.engine_pods", "registry"),
    ("localmodel.render", "outputs"),
    ("localmodel.render.names", "outputs"),
    ("localmodel.api.spec", "api"),
    ("localmodel.incremental", "desired"),
    ("localmodel.incremental.render", "desired"),
    ("localmodel.gateway", "programs"),
    ("localmodel.gateway.server", "programs"),
])
def test_a_module_lands_in_its_layer(module: str, layer: str) -> None:
    where = place(module)
    assert isinstance(where, Place), where
    assert LAYERS[where.layer].name == layer


# ---- the checker, on planted imports --------------------------------------------------


def _planted(module: str, code: str) -> list[str]:
    """What the check says of the tree with `code` added at the end of `module`."""
    sources = read_package()
    source, is_package = sources[module]
    sources[module] = (source + "\n" + code + "\n", is_package)
    return check(sources)


# case -> (module, code whose last line is the import, what the check says)
PLANTED = {
    "module level": ("localmodel.planner.fit",
                     "from localmodel.controller.observed import Observed",
                     "localmodel.planner.fit:{line} (planner) imports "
                     "localmodel.controller.observed (programs): a layer above"),
    "in a function": ("localmodel.facts.quantity",
                      "def planted() -> None:\n    from localmodel.api import LocalModel",
                      "localmodel.facts.quantity:{line} (foundation) imports localmodel.api "
                      "(api): a layer above"),
    "TYPE_CHECKING": ("localmodel.rules.model",
                      "from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from localmodel.desired import Desired",
                      "localmodel.rules.model:{line} (rule shapes) imports localmodel.desired "
                      "(desired): a layer above"),
    "relative": ("localmodel.planner.fit",
                 "from ..status import build_status",
                 "localmodel.planner.fit:{line} (planner) imports localmodel.status "
                 "(outputs): a layer above"),
    "a submodule by name": ("localmodel.api.checks",
                            "import localmodel.kube",
                            "localmodel.api.checks:{line} (api) imports localmodel.kube "
                            "(shell): a layer above"),
    "engine facts asking the adapters": ("localmodel.engines.ollama",
                                         "from localmodel.engines import registry",
                                         "localmodel.engines.ollama:{line} (foundation) imports "
                                         "localmodel.engines.registry (registry): "
                                         "a layer above"),
    "an engine part asking the rules": ("localmodel.engines.ollama.pod",
                                        "from localmodel.rules import RULES",
                                        "localmodel.engines.ollama.pod:{line} (engine adapters) "
                                        "imports localmodel.rules (rules): a layer above"),
    "across the programs": ("localmodel.doctor.report",
                            "from localmodel.controller import observed",
                            "localmodel.doctor.report:{line} (programs) imports "
                            "localmodel.controller.observed: another room of an "
                            "independent layer"),
}


@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_import_fails(case: str) -> None:
    module, code, message = PLANTED[case]
    source = read_package()[module][0]
    line = len((source + "\n" + code).splitlines())
    assert _planted(module, code) == [message.format(line=line)]


def test_an_import_down_or_within_a_room_passes() -> None:
    assert _planted("localmodel.controller.observed",
                    "def planted() -> None:\n    from localmodel.controller import changes\n"
                    "    from localmodel.planner import plan\n"
                    "    from localmodel import errors") == []


def test_an_undeclared_module_fails() -> None:
    sources = {**read_package(), "localmodel.planted": ("", False)}
    assert check(sources) == [
        "localmodel.planted is in no layer: declare it in tests/architecture/test_layers.py LAYERS"]


def test_an_allowance_no_import_needs_fails() -> None:
    allowed = {**ALLOWED, ("localmodel.gateway.**", "localmodel.probe.**"): "planted"}
    assert check(read_package(), allowed=allowed) == [
        "ALLOWED localmodel.gateway.** -> localmodel.probe.**: no such import any more; "
        "remove it"]


def _with(sources: dict[str, tuple[str, bool]], module: str, code: str
          ) -> dict[str, tuple[str, bool]]:
    source, is_package = sources[module]
    return {**sources, module: (source + "\n" + code + "\n", is_package)}


_BACK = "def planted() -> None:\n    from localmodel.controller.observed import Observed"
_PLANTED_CYCLE = {
    frozenset({"localmodel.controller.observed", "localmodel.controller.volumes"}): "planted"}


def test_a_planted_cycle_within_a_room_fails() -> None:
    # observed reads the volumes (controller/volumes.py); an import back, in a
    # function, closes a loop inside the operator's room.
    sources = _with(read_package(), "localmodel.controller.volumes", _BACK)
    assert check_cycles(sources) == [
        "import cycle: localmodel.controller.observed <-> localmodel.controller.volumes"]
    assert check(sources) == []  # (the layer check alone passes it)


def test_a_planted_cycle_under_type_checking_fails() -> None:
    # observed reads times through controller/clock.py; a type named back closes a loop.
    sources = _with(read_package(), "localmodel.controller.clock",
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from localmodel.controller.observed import Observed")
    assert check_cycles(sources) == [
        "import cycle: localmodel.controller.clock <-> localmodel.controller.observed"]


def test_a_known_cycle_no_import_needs_fails() -> None:
    assert check_cycles(read_package(), _PLANTED_CYCLE) == [
        "KNOWN_CYCLES localmodel.controller.observed <-> localmodel.controller.volumes: no "
        "such cycle any more; remove it"]


def test_a_known_cycle_passes_while_it_lasts() -> None:
    sources = _with(read_package(), "localmodel.controller.volumes", _BACK)
    assert check_cycles(sources, _PLANTED_CYCLE) == []


def test_a_cycle_through_three_modules_is_one_component() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [frozenset({"a", "b", "c"})]


def test_two_patterns_alike_fail() -> None:
    layers = (*LAYERS, Layer("planted", "a second claim", ("localmodel.planner.*",)))
    assert place("localmodel.planner.fit", layers) == (
        "localmodel.planner.fit matches localmodel.planner.**, localmodel.planner.* alike: "
        "make one more specific")
