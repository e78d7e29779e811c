"""Each room holds one job: no module of the package over 500 lines and no
function over 60 (issue 29). A declaration table is a class body or a
module-level constant, which this does not count; a function that grows past
the bound is split by job, or named here with its reason."""

from __future__ import annotations

import ast

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit

PACKAGE = codebase.PACKAGE
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
# "module:function" -> why it may be longer (none now).
LONGER: dict[str, str] = {}


def long_functions(code: str | ast.AST, bound: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function or method in `code` (text or its tree) longer
    than `bound`."""
    found = []
    for node in ast.walk(ast.parse(code) if isinstance(code, str) else code):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > bound:
                found.append((node.name, lines))
    return found


def _modules() -> tuple[codebase.Module, ...]:
    return codebase.modules()


def test_no_module_is_over_the_bound() -> None:
    big = [
        f"{m.rel}: {n} lines"
        for m in _modules()
        if (n := len(m.text.splitlines())) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split by job):\n" + "\n".join(big)


def test_no_function_is_over_the_bound() -> None:
    long = [
        f"{m.rel}:{name}: {n} lines"
        for m in _modules()
        for name, n in long_functions(m.tree)
        if f"{m.rel}:{name}" not in LONGER
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ("    pass\n" * 59, []),
        ("    pass\n" * 60, [("f", 61)]),
    ],
)
def test_the_function_bound_counts_the_def_line_too(body: str, found: list[object]) -> None:
    assert long_functions("def f():\n" + body) == found


def test_methods_and_async_functions_count() -> None:
    source = "class C:\n    async def m(self):\n" + "        pass\n" * 70
    assert long_functions(source) == [("m", 71)]
