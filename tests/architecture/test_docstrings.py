"""Each room says what it is for (issue 43): every module and every class of the
package has a docstring whose first line starts it, and whose summary (its
first paragraph) ends as a sentence does. A class says what it keeps or
decides; a reader opening any file or class learns its job before its code.

The exceptions are classes of the LocalModel API whose docstring the CRD would
carry (pydantic puts an enum's or a model's docstring into its schema's
description, and the CRD in crds/ stays byte-identical): they say what they are
in a comment instead, and are named here with that reason. An entry no class
needs any more fails: the list only shrinks."""

from __future__ import annotations

import ast
import importlib

import pytest

from localmodel.crd import crd_yaml
from tests.architecture import codebase

pytestmark = pytest.mark.unit

_CRD = "the CRD would carry its docstring as the field's description (crds/ stays byte-identical)"
# "module:Class" (the module's path below the package) -> why it has no docstring.
UNDOCUMENTED: dict[str, str] = {
    "api/spec.py:KVCacheType": _CRD,
    "api/spec.py:FlashAttention": _CRD,
    "api/status.py:ConditionStatus": _CRD,
    "api/toleration.py:TolerationOperator": _CRD,
    "api/toleration.py:TaintEffect": _CRD,
}

# What a summary may end with, once closing brackets and quotes are set aside.
_SENTENCE_ENDS = (".", "!", "?", ":")


def _docstring(node: ast.Module | ast.ClassDef) -> str | None:
    """The docstring as written (not cleaned: a blank first line shows), or None."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        value = body[0].value.value
        return value if isinstance(value, str) else None
    return None


def fault(node: ast.Module | ast.ClassDef) -> str | None:
    """What is wrong with `node`'s docstring, or None when its first line starts
    a sentence and its summary ends one."""
    doc = _docstring(node)
    if doc is None or not doc.strip():
        return "no docstring"
    if not doc.splitlines()[0].strip():
        return "its first line is empty (the summary starts after the quotes)"
    summary = doc.strip().split("\n\n")[0].strip()
    if not summary.rstrip(")]\"'`").endswith(_SENTENCE_ENDS):
        return f"its summary does not end as a sentence: ...{summary[-40:]!r}"
    return None


def faults(code: str | ast.Module) -> dict[str, str]:
    """The module's (as "") and each class's fault, by class name (nested ones too)."""
    tree = ast.parse(code) if isinstance(code, str) else code
    found = {}
    if (why := fault(tree)) is not None:
        found[""] = why
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (why := fault(node)) is not None:
            found[node.name] = why
    return found


def _package_faults() -> dict[str, str]:
    """Every fault of the package, as "module" or "module:Class" -> what is wrong."""
    return {
        f"{m.rel}:{name}" if name else m.rel: why
        for m in codebase.modules()
        for name, why in faults(m.tree).items()
    }


def test_every_module_and_class_says_what_it_is_for() -> None:
    found = [f"{where}: {why}" for where, why in sorted(_package_faults().items())
             if where not in UNDOCUMENTED]
    assert not found, (
        "say in the docstring's first line what it keeps or decides "
        "(or, where the CRD would carry it, name it in UNDOCUMENTED with why):\n"
        + "\n".join(found))


def test_each_exemption_is_still_needed() -> None:
    stale = sorted(UNDOCUMENTED.keys() - _package_faults().keys())
    assert not stale, "documented now or gone (remove from UNDOCUMENTED):\n" + "\n".join(stale)


@pytest.mark.parametrize("where", sorted(k for k, why in UNDOCUMENTED.items() if why == _CRD))
def test_the_crd_would_carry_an_exempt_class_docstring(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel, name = where.split(":")
    module = importlib.import_module(next(m.name for m in codebase.modules() if m.rel == rel))
    before = crd_yaml()
    monkeypatch.setattr(getattr(module, name), "__doc__", "Planted sentence.")
    # (pydantic then lays the field out as a reference to the enum: the CRD changes
    # even where the field's own description hides the docstring's words)
    assert crd_yaml() != before


_DOCUMENTED = '"""The module."""\n\n\nclass Kept:\n    """Keeps one thing."""\n'


@pytest.mark.parametrize(
    ("planted", "found"),
    [
        ("class Bare:\n    x = 1\n", {"Bare": "no docstring"}),
        ('class Blank:\n    """"""\n', {"Blank": "no docstring"}),
        ('class Late:\n    """\n    Keeps one thing.\n    """\n',
         {"Late": "its first line is empty (the summary starts after the quotes)"}),
        ('class Unended:\n    """Keeps one thing\n\n    More."""\n',
         {"Unended": "its summary does not end as a sentence: ...'Keeps one thing'"}),
        ("class Outer:\n    \"\"\"Keeps.\"\"\"\n\n    class Inner:\n        pass\n",
         {"Inner": "no docstring"}),
        ('class Wrapped:\n    """Keeps one thing (and\n    another.)"""\n', {}),
    ],
)
def test_a_planted_class_without_a_sentence_is_found(planted: str, found: dict[str, str]) -> None:
    assert faults(_DOCUMENTED + "\n\n" + planted) == found


def test_a_module_without_a_docstring_is_found() -> None:
    assert faults("class Kept:\n    \"\"\"Keeps one thing.\"\"\"\n") == {"": "no docstring"}


def test_the_package_check_names_a_planted_class() -> None:
    module = next(m for m in codebase.modules() if m.rel == "catalog.py")
    planted = ast.parse(module.text + "\n\nclass Planted:\n    x = 1\n")
    assert faults(planted) == {"Planted": "no docstring"}
