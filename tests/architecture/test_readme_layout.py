"""The README's Layout section names every module and package of the code, and
nothing that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "localmodel"


def layout() -> dict[str, list[str]]:
    """Top-level entries of the Layout block -> the sub-entries listed under them."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    entries: dict[str, list[str]] = {}
    last = ""
    for line in block.splitlines():
        m = re.match(r"^( {2,4})(\S+(?:, \S+)*)\s{2,}", line)
        if not m:
            continue
        names = m.group(2).split(", ")
        if len(m.group(1)) == 2:
            for name in names:
                entries[name] = []
            last = names[-1]
        else:
            entries[last] += names
    return entries


def test_every_listed_path_exists() -> None:
    for name, children in layout().items():
        assert (PACKAGE / name).exists(), f"README Layout lists {name}, which does not exist"
        for child in children:
            assert (PACKAGE / name / child).exists(), f"README Layout lists {name}{child}"


def test_every_module_and_package_is_listed() -> None:
    listed = set(layout())
    present = {
        p.name + ("/" if p.is_dir() else "")
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert present - listed == set(), "add these to the README's Layout section"
