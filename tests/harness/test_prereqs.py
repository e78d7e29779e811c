"""tests/harness/prereqs.py: the run hack/test.sh makes while the engines and
images build fails a test that reaches for them, and the two runs' selection
is the markers the guard names."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.harness import engines, images
from tests.harness.prereqs import ENGINE_MARKERS, ENGINES_BUILDING, EnginesBuildingError
from tests.harness.tools import REPO_ROOT


def test_while_the_engines_build_asking_for_a_part_or_an_image_fails_naming_the_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENGINES_BUILDING, "1")
    with pytest.raises(EnginesBuildingError, match=r"pytest\.mark\.engine"):
        engines.path("llama-server")
    with pytest.raises(EnginesBuildingError, match=r"build-engines\.sh"):
        engines.require("model")
    with pytest.raises(EnginesBuildingError, match=r"build-images\.sh"):
        images.list_images()


@pytest.mark.engine  # the images' listing reads what the engine builds made
def test_otherwise_the_parts_and_images_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINES_BUILDING, raising=False)
    assert engines.path("llama-server").name == "llama-server"
    assert any(i.reference.startswith("registry.k8s.io/pause:") for i in images.list_images())


def test_test_sh_splits_its_runs_on_the_guards_markers() -> None:
    script = (REPO_ROOT / "hack" / "test.sh").read_text()
    found = re.search(r'^engine_tests="([^"]*)"$', script, re.M)
    assert found, "hack/test.sh sets no engine_tests"
    assert found.group(1) == " or ".join(ENGINE_MARKERS)
    assert f"{ENGINES_BUILDING}=1" in script
    assert '-m "not ($engine_tests)"' in script and '-m "$engine_tests"' in script
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    markers = {m.split(":")[0] for m in declared["tool"]["pytest"]["ini_options"]["markers"]}
    assert set(ENGINE_MARKERS) <= markers
