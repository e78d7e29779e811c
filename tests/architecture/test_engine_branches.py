"""No code outside operator/localmodel/engines/ branches on an engine's name
(issue 29: each engine an adapter). Code that needs to know how an engine does
something asks its adapter (`localmodel.engines.registry.engine(name)`) or its
facts; a branch on the name would have to be found and extended for every new
engine.

A branch, as this test sees it: a comparison (==, !=, is, is not, in, not in)
with an engine's name, a `match` case on one, or a dict display keyed by one.
An engine's name is an `EngineName` member, an engine module's `NAME` (however
the module is imported from localmodel.engines), or the literal "ollama" /
"llama-server". Data that names engines without branching (a rule's
`engines=frozenset({...})`, an enum's members) is not a branch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from localmodel import engines
from tests.architecture import codebase

pytestmark = pytest.mark.unit

ROOT = codebase.ROOT
PACKAGE = codebase.PACKAGE
HOME = "engines/"  # the engines' own package: the one place that may
NAMES = frozenset(engines.NAMES)  # every registered engine's, a new one's included


_COMPARISONS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)


class _Branches(ast.NodeVisitor):
    """Collects (line, what) for each branch on an engine's name in one module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.modules: set[str] = set()  # local names bound to an engine module
        self.names: set[str] = set()  # local names bound to an engine module's NAME

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            local = alias.asname or alias.name
            if module == "localmodel.engines":
                self.modules.add(local)
            elif module.startswith("localmodel.engines.") and alias.name == "NAME":
                self.names.add(local)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("localmodel.engines.") and alias.asname:
                self.modules.add(alias.asname)
        self.generic_visit(node)

    def is_name(self, node: ast.expr) -> bool:
        """Whether `node` spells an engine's name."""
        if isinstance(node, ast.Constant):
            return node.value in NAMES
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "EngineName":
                return True
            if node.attr == "NAME":
                return isinstance(base, ast.Name) and base.id in self.modules
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self.is_name(e) for e in node.elts)
        return False

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, _COMPARISONS) for op in node.ops) and any(
            self.is_name(side) for side in [node.left, *node.comparators]
        ):
            self.found.append((node.lineno, "comparison with an engine's name"))
        self.generic_visit(node)

    def visit_match_case(self, node: ast.match_case) -> None:
        for pattern in ast.walk(node.pattern):
            if isinstance(pattern, ast.MatchValue) and self.is_name(pattern.value):
                self.found.append((pattern.lineno, "match case on an engine's name"))
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if any(key is not None and self.is_name(key) for key in node.keys):
            self.found.append((node.lineno, "dict keyed by an engine's name"))
        self.generic_visit(node)


def branches(source: str | ast.Module) -> list[tuple[int, str]]:
    """(line, what) for each branch on an engine's name in a module's source (or
    its tree)."""
    visitor = _Branches()
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):  # imports first, wherever they are
        if isinstance(node, ast.Import | ast.ImportFrom):
            visitor.visit(node)
    visitor.found.clear()
    visitor.visit(tree)
    return sorted(visitor.found)


def _modules() -> Iterator[tuple[str, Path]]:
    for module in codebase.modules():
        if not module.rel.startswith(HOME):
            yield module.rel, module.path


def test_no_code_outside_the_engines_branches_on_an_engine_name() -> None:
    found = [
        f"operator/localmodel/{rel}:{line}: {what}"
        for rel, path in _modules()
        for line, what in branches(codebase.tree(path))
    ]
    assert not found, (
        "branches on an engine's name outside operator/localmodel/engines/ (ask the "
        "engine's adapter, localmodel.engines.registry.engine(name)):\n" + "\n".join(found)
    )


# The modules outside engines/ that still import one engine's own package, each
# with what ends it. An entry no import needs any more fails too: the list only
# shrinks.
IMPORTS_ONE_ENGINE: dict[str, str] = {
    "rules/table.py": "each engine's own rules in its package (issue 43, rooms-engines)",
}
# The engines' own packages under localmodel.engines (a test-only one lives elsewhere).
ENGINE_PACKAGES = frozenset(
    engines.package(e).rsplit(".", 1)[1] for e in engines.SHIPPED
)


def imports_one_engine(source: str) -> bool:
    """Whether a module imports an engine's own package (its facts, its
    modules) by the engine's name, instead of asking by name through
    localmodel.engines, its registry or its timings."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if parts[:2] == ["localmodel", "engines"] and (
                (len(parts) > 2 and parts[2] in ENGINE_PACKAGES)
                or (len(parts) == 2 and any(a.name in ENGINE_PACKAGES for a in node.names))
            ):
                return True
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[:3] in [["localmodel", "engines", p] for p in ENGINE_PACKAGES]
            for a in node.names
        ):
            return True
    return False


def test_no_code_outside_the_engines_imports_one_engine_by_its_name() -> None:
    found = {rel for rel, path in _modules() if imports_one_engine(path.read_text())}
    assert found - set(IMPORTS_ONE_ENGINE) == set(), (
        "modules outside operator/localmodel/engines/ that import one engine's package "
        "(ask localmodel.engines.facts(name), the registry or engines.timings; the callers' "
        "API is gateway_contract/client_api.py)"
    )
    assert set(IMPORTS_ONE_ENGINE) - found == set(), "no longer imported: drop from the list"


@pytest.mark.parametrize(("source", "imports"), [
    ("from localmodel.engines import ollama\n", True),
    ("from localmodel.engines import FACTS, llama_server\n", True),
    ("from localmodel.engines.ollama import timing\n", True),
    ("import localmodel.engines.llama_server.timing as t\n", True),
    ("from localmodel.engines import facts, timings\n", False),
    ("from localmodel.engines.registry import engine\n", False),
    ("from localmodel.gateway_contract import client_api\n", False),
])
def test_the_import_check_tells_one_engine_from_the_registry(source: str, imports: bool) -> None:
    assert imports_one_engine(source) is imports


def test_the_scan_sees_the_package() -> None:
    scanned = [rel for rel, _ in _modules()]
    assert "rules/table.py" in scanned and "doctor/cluster.py" in scanned
    assert not any(rel.startswith(HOME) for rel in scanned)


PLANTED = [
    "from localmodel.api import EngineName\nif spec.engine.name is EngineName.LLAMA_SERVER:\n"
    "    pass\n",
    "from localmodel.api import EngineName\nx = a if e == EngineName.OLLAMA else b\n",
    "from localmodel.engines import ollama\nif kind != ollama.NAME:\n    pass\n",
    "from localmodel.engines import llama_server as facts\nok = kind == facts.NAME\n",
    "from localmodel.engines.ollama import NAME\nok = NAME == kind\n",
    "from localmodel.engines import llama_server, ollama\n"
    "ok = kind in (ollama.NAME, llama_server.NAME)\n",
    'if kind == "llama-server":\n    pass\n',
    'ok = "ollama" != kind\n',
    "from localmodel.api import EngineName\nmatch e:\n    case EngineName.OLLAMA:\n"
    "        pass\n",
    'match kind:\n    case "ollama" | "other":\n        pass\n',
    "from localmodel.engines import llama_server, ollama\n"
    "PROCESSES = {llama_server.NAME: 1, ollama.NAME: 2}\n",
    "from localmodel.api import EngineName\nIMAGES = {EngineName.OLLAMA: 'x'}\n",
    'PATHS = {"llama-server": "/models"}\n',
    "def f(kind):\n    from localmodel.engines import ollama\n    return kind is ollama.NAME\n",
]


@pytest.mark.parametrize("source", PLANTED)
def test_the_checker_finds_a_planted_branch(source: str) -> None:
    assert len(branches(source)) == 1, source


CLEAN = [
    # Data that names engines, and asking the adapter, are not branches.
    "from localmodel.api import EngineName\nONLY = frozenset({EngineName.OLLAMA})\n",
    "from localmodel.engines.registry import engine\nhow = engine(ctx.engine).threads(4)\n",
    "from localmodel.engines import ollama\nurl = f'http://127.0.0.1:{ollama.PORT}'\n",
    "from localmodel.engines import ollama\nname = ollama.NAME\n",
    "ok = ctx.engine not in rule.engines\n",
    'ok = kind == "gateway"\n',
    'words = {"ollama-like": 1}\n',
    "class Other:\n    NAME = 'x'\nok = kind == Other.NAME\n",
]


@pytest.mark.parametrize("source", CLEAN)
def test_the_checker_leaves_what_is_not_a_branch(source: str) -> None:
    assert branches(source) == [], source


def test_the_checker_on_a_planted_module(tmp_path: Path) -> None:
    """A whole module as the scan reads it: the branch's line is named."""
    module = tmp_path / "planted.py"
    module.write_text(
        "from localmodel.engines import llama_server\n\n\n"
        "def args(kind: str) -> list[str]:\n"
        "    if kind == llama_server.NAME:\n"
        "        return ['-t', '4']\n"
        "    return []\n"
    )
    assert branches(module.read_text()) == [(5, "comparison with an engine's name")]
