"""Each shipped engine's build lives in its package: hack/build-engines.sh
sources engines/<name>/build.sh and hack/build-images.sh engines/<name>/image.sh,
and neither script names an engine in its code, but for the root filesystems'
package sets (rootfs_args), whose text is part of every rootfs cache key."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from localmodel import engines

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("hack/build-engines.sh", "hack/build-images.sh")
# (script, function): why an engine may be named there.
NAMED_IN = {
    ("hack/build-images.sh", "rootfs_args"): "each root filesystem's package set; the "
    "function's text is hashed into every rootfs (and so image) cache key",
}


def _package_dir(facts: engines.EngineFacts) -> Path:
    return Path(sys.modules[engines.package(facts)].__file__ or "").parent


@pytest.mark.parametrize("name", [e.NAME for e in engines.SHIPPED])
def test_every_shipped_engine_brings_its_build_and_its_image(name: str) -> None:
    home = _package_dir(engines.facts(name))
    for script, defines in (("build.sh", "build_"), ("image.sh", f"build_{name}()")):
        text = (home / script).read_text()
        assert defines in text, f"{home / script} defines no {defines}"


def _engine_lines(script: str) -> list[tuple[str, int, str]]:
    """(function, line, text) of each code line that names a shipped engine."""
    words = {e.NAME for e in engines.SHIPPED} | {
        engines.package(e).rsplit(".", 1)[1] for e in engines.SHIPPED}
    named = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(words))) + r")(?![\w-])")
    function, found = "", []
    for number, line in enumerate((ROOT / script).read_text().splitlines(), 1):
        code = line.split(" #", 1)[0]
        if code.lstrip().startswith("#"):
            continue
        start = re.match(r"^([\w-]+)\(\) \{", code)
        if start:
            function = start.group(1)
        elif code.startswith("}"):
            function = ""
        if named.search(code):
            found.append((function, number, code.strip()))
    return found


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_build_scripts_name_no_engine_in_their_code(script: str) -> None:
    stray = [f"{script}:{n}: {text}" for function, n, text in _engine_lines(script)
             if (script, function) not in NAMED_IN]
    assert not stray, "name the engine in its package's build.sh/image.sh:\n" + "\n".join(stray)


def test_the_allowed_names_are_still_needed() -> None:
    used = {(script, function) for script in SCRIPTS for function, _, _ in _engine_lines(script)}
    assert set(NAMED_IN) <= used
