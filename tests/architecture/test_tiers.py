"""Tiers are markers on the tests, never their folder (tests/README.md): a
module of the `unit` tier marks no tier that needs a build too, and no
conftest marks tests by where they live."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit

TESTS = codebase.ROOT / "tests"
TIERS = {"unit", "e2e", "engine", "llama", "realnode"}


def marks(tree: ast.AST) -> set[str]:
    """The `pytest.mark.NAME` a module's code names."""
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
            and isinstance(n.value.value, ast.Name) and n.value.value.id == "pytest"}


def _relative(path: Path) -> str:
    return path.relative_to(codebase.ROOT).as_posix()


def test_a_unit_module_needs_no_build() -> None:
    both = {_relative(p): sorted(found & TIERS - {"unit"})
            for p in codebase.files(TESTS, "test_*.py")
            if "unit" in (found := marks(codebase.tree(p))) and found & TIERS - {"unit"}}
    assert not both, f"`unit` means nothing built; these mark more: {both}"


def test_no_conftest_marks_tests_by_their_folder() -> None:
    marking = [_relative(p) for p in codebase.files(TESTS, "conftest.py")
               if "add_marker" in codebase.text(p)
               or "pytest_collection_modifyitems" in codebase.text(p)]
    assert not marking, f"put the marker on the tests (pytestmark): {marking}"


def test_the_mark_reader_sees_a_module_mark_and_a_test_mark() -> None:
    tree = ast.parse("pytestmark = [pytest.mark.e2e]\n@pytest.mark.llama\ndef test_x(): pass\n")
    assert marks(tree) == {"e2e", "llama"}
