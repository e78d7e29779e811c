"""The architecture tests' one walk of the source (codebase.py): every module of
the package once, named as Python imports it, each file read and parsed once."""

from __future__ import annotations

import ast

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit


def test_every_module_of_the_package_is_walked_once_by_its_import_name() -> None:
    walked = codebase.modules()
    assert sorted(m.path for m in walked) == sorted(codebase.PACKAGE.rglob("*.py"))
    names = [m.name for m in walked]
    assert len(names) == len(set(names))
    by_name = {m.name: m for m in walked}
    assert by_name["localmodel"].is_package and by_name["localmodel"].rel == "__init__.py"
    assert by_name["localmodel.gateway"].rel == "gateway/__init__.py"
    assert not by_name["localmodel.gateway.server"].is_package
    assert codebase.module_file("localmodel.gateway.server") == (
        codebase.PACKAGE / "gateway" / "server.py")
    assert codebase.module_file("localmodel.gateway.nothing") is None


def test_under_a_folder_is_that_folder_only() -> None:
    router = codebase.under("router")
    assert router and all(m.name.startswith("localmodel.router") for m in router)
    assert "localmodel.router" in {m.name for m in router}  # its __init__ too
    both = codebase.under("router", "gateway")
    assert {m.name for m in both} == (
        {m.name for m in router} | {m.name for m in codebase.under("gateway")})
    assert not [m for m in codebase.under("gate") if m.name.startswith("localmodel.gateway")]


def test_a_file_is_read_and_parsed_once() -> None:
    module = codebase.modules()[0]
    assert module.tree is codebase.tree(module.path)
    assert module.text is codebase.text(module.path)
    assert isinstance(module.tree, ast.Module)


def test_docstrings_are_the_prose_not_the_code() -> None:
    tree = ast.parse('"""module"""\nX = "code"\ndef f():\n    """f"""\n    return "also code"\n')
    prose = codebase.docstrings(tree)
    strings = {n.value: id(n) in prose for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert strings == {"module": True, "code": False, "f": True, "also code": False}
