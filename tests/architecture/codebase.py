"""The repository's source as the architecture tests read it: one walk of the
package (every module by its dotted name, its path, text and syntax tree) and
of any other folder, each file read and parsed once per session.

The tests that check the house's shape from its source (layers, sizes, one
home for each engine fact, no engine branches, the contracts' homes, one
launcher, unique test names) all read through here rather than each its own
rglob, read and parse. What is cached is never changed: a test that plants a
module works on a copy (test_layers.py's `read_package()` is a new dict)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "operator"
PACKAGE = BASE / "localmodel"


@dataclass(frozen=True)
class Module:
    """One .py file of a package: `name` is its dotted module name (a package
    by its own name, not `__init__`), `rel` its path below the package root."""

    name: str
    path: Path
    rel: str
    is_package: bool

    @property
    def text(self) -> str:
        return text(self.path)

    @property
    def tree(self) -> ast.Module:
        return tree(self.path)


@functools.cache
def text(path: Path) -> str:
    """A file's text, read once."""
    return path.read_text()


@functools.cache
def tree(path: Path) -> ast.Module:
    """A Python file's syntax tree, parsed once (its path in any error)."""
    return ast.parse(text(path), str(path))


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in `tree` (the module's, each class's
    and each function's): prose that names a fact is not a copy of it."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


@functools.cache
def modules(package: Path = PACKAGE) -> tuple[Module, ...]:
    """Every module of `package` (default: operator/localmodel), by path."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found.append(Module(".".join(parts), path, path.relative_to(package).as_posix(),
                            is_package))
    return tuple(found)


def under(*folders: str) -> list[Module]:
    """The package's modules below any of `folders` (e.g. "router", "gateway")."""
    return [m for m in modules() if any(m.rel.startswith(f"{f}/") for f in folders)]


@functools.cache
def module_file(name: str) -> Path | None:
    """The file of the package's module `name` (dotted), if there is one."""
    return next((m.path for m in modules() if m.name == name), None)


@functools.cache
def files(folder: Path, pattern: str = "*") -> tuple[Path, ...]:
    """Every file below `folder` whose name matches `pattern`, by path."""
    return tuple(p for p in sorted(folder.rglob(pattern)) if p.is_file())
