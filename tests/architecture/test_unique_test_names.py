"""Test modules live in directories without `__init__.py`, so pytest imports
each by its basename: two `test_x.py` in different folders make the whole
suite's collection fail ("import file mismatch"), and only a full run shows
it. This fails first, naming both files."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit

TESTS = codebase.ROOT / "tests"


def test_every_test_module_has_a_basename_of_its_own() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in codebase.files(TESTS, "test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS.parent)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one): {clashes}"
