"""The README's Layout section names every top-level module and package of the
code, and nothing that does not exist; every module and package below them is
named there or in docs/architecture.md (issue 43), and a failure names it."""

from __future__ import annotations

import ast
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


# ---- every module named: in the Layout, or in docs/architecture.md --------------


def layout_sections() -> dict[str, str]:
    """Each top-level entry of the Layout block -> its text (its line and the
    lines under it, up to the next top-level entry)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    sections: dict[str, list[str]] = {}
    last: list[str] = []
    for line in block.splitlines():
        m = re.match(r"^ {2}(\S+(?:, \S+)*)\s{2,}", line)
        if m:
            last = m.group(1).split(", ")
        for name in last:
            sections.setdefault(name, []).append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def rooms(package: Path) -> list[str]:
    """Every module (`planner/place.py`) and package (`engines/ollama/`) of the
    code, as a path under the package; the package itself is not one."""
    found = []
    for p in sorted(package.rglob("*.py")):
        rel = p.relative_to(package)
        if rel.name != "__init__.py":
            found.append(rel.as_posix())
        elif rel.parent != Path("."):
            found.append(rel.parent.as_posix() + "/")
    return found


def unnamed(names: list[str], sections: dict[str, str], architecture: str) -> list[str]:
    """The rooms neither the Layout nor docs/architecture.md names. The Layout
    names a room under its top-level entry, by its file name (`place.py`,
    `ollama/`) or its bare name (`parsed` in a list of words); the architecture
    page names it by its path under the package (`controller/parsed.py`)."""
    missing = []
    for name in names:
        parts = name.rstrip("/").split("/")
        top = parts[0] + "/" if len(parts) > 1 or name.endswith("/") else parts[0]
        section = sections.get(top, "")
        leaf = parts[-1] + ("/" if name.endswith("/") else "")
        stem = parts[-1].removesuffix(".py")
        in_layout = bool(section) and (
            len(parts) == 1 or leaf in section or re.search(rf"\b{re.escape(stem)}\b", section)
        )
        if not (in_layout or f"`{name}`" in architecture or f"{name} " in architecture):
            missing.append(name)
    return missing


def test_every_module_and_package_is_named_in_the_layout_or_the_architecture_doc() -> None:
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    missing = unnamed(rooms(PACKAGE), layout_sections(), architecture)
    assert not missing, (
        "name these in the README's Layout (under their package) or in docs/architecture.md "
        "(by their path, e.g. `planner/place.py`):\n" + "\n".join(missing)
    )


def test_a_module_named_nowhere_is_reported_by_its_path() -> None:
    sections = {"planner/": "  planner/   pure\n    place.py  plan()", "desired.py": "desired"}
    architecture = "the pass reads `planner/keeping.py` first"
    names = ["desired.py", "planner/", "planner/place.py", "planner/keeping.py",
             "planner/inputs.py", "gateway/server.py"]
    assert unnamed(names, sections, architecture) == ["planner/inputs.py", "gateway/server.py"]


def test_every_test_the_architecture_doc_names_for_a_memo_layer_exists() -> None:
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    rows = [ln for ln in architecture.splitlines() if ln.startswith("| ") and "tests/" in ln]
    assert rows, "docs/architecture.md has no memo-layer table"
    for row in rows:
        files = [ROOT / f for f in re.findall(r"(tests/\S+?\.py)", row)]
        source = "".join(f.read_text() for f in files)
        for name in re.findall(r"`(test_\w+)`", row):
            assert f"def {name}(" in source, f"docs/architecture.md names {name}, not in {files}"


def test_each_memo_layer_says_first_what_it_keeps_and_keys_on() -> None:
    """The architecture page's memo layers, each row's first `Class`
    (`module.py`): each class's docstring opens with what it keeps, and its
    first paragraph says what it is keyed on (issue 43: a cache named for what
    it saves)."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    rows = [ln for ln in architecture.splitlines() if ln.startswith("| ") and "tests/" in ln]
    layers = [m.groups() for row in rows if (m := re.search(r"`(\w+)` \(`(\w+/\w+\.py)`", row))]
    assert len(layers) >= 6, layers
    for name, module in layers:
        tree = ast.parse((PACKAGE / module).read_text())
        [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        doc = ast.get_docstring(cls) or ""
        first = doc.split("\n\n", 1)[0]
        assert doc.startswith("Keeps ") and "keyed on" in first, f"{module}:{name}: {first!r}"
