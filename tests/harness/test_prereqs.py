"""tests/harness/prereqs.py and hack/test.sh's three runs: a run that does not
wait for a build fails a test that reaches for what it builds (the real node
of the `llama` run is given every image but Ollama's), and the runs' marker
expressions give every test exactly one run."""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

import pytest

from tests.harness import engines, images
from tests.harness.prereqs import (
    BUILDING,
    ENGINES_BUILDING,
    IMAGE_NAMES,
    LLAMA_IMAGES,
    LLAMA_PARTS,
    EnginesBuildingError,
    given_images,
)
from tests.harness.tools import REPO_ROOT, print_output

SCRIPT = (REPO_ROOT / "hack" / "test.sh").read_text()
MARKERS = ("unit", "engine", "realnode", "llama")


def test_while_the_engines_build_no_part_or_image_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENGINES_BUILDING, "all")
    for name in ("llama-server", "model", "ollama"):
        with pytest.raises(EnginesBuildingError, match=r"pytest\.mark\.engine"):
            engines.path(name)
    with pytest.raises(EnginesBuildingError, match=r"build-engines\.sh's model"):
        engines.require("model")
    with pytest.raises(EnginesBuildingError, match=r"build-images\.sh"):
        images.list_images()


def test_while_ollama_builds_only_llama_servers_parts_are_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENGINES_BUILDING, "ollama")
    for name in sorted(LLAMA_PARTS):
        assert engines.path(name).name  # given: the build-engines.sh --print path
    for name in ("ollama", "ollama-lib", "llama.cpp-source"):
        with pytest.raises(EnginesBuildingError, match="llama` marker off"):
            engines.path(name)
    # The real node gets every image but Ollama's: the llama-server tests run there too.
    assert given_images() == ("operator", "llama-server", "pause", "helper")
    listed = [i.reference for i in images.list_images()]
    everything = {i.reference for i in _listed_without_building(monkeypatch)}
    [ollama_image] = everything - set(listed)
    assert ollama_image.startswith("docker.io/ollama/ollama:"), ollama_image
    assert [i.reference for i in images.list_images("llama-server")] == [
        r for r in listed if r.startswith("ghcr.io/ggml-org/llama.cpp:")]
    for names in (("ollama",), ("operator", "ollama")):
        with pytest.raises(EnginesBuildingError, match=r"ollama image.*llama` marker off"):
            images.list_images(*names)
        with pytest.raises(EnginesBuildingError, match="ollama image"):
            given_images(names)


def _listed_without_building(monkeypatch: pytest.MonkeyPatch) -> list[images.Image]:
    with monkeypatch.context() as m:
        m.delenv(ENGINES_BUILDING)
        return images.list_images()


def test_the_image_names_are_build_images_sh_names_in_its_order() -> None:
    """The script's names, in its order: the operator, each shipped engine's
    (from its package's image.sh, in the registry's order), pause, helper;
    read from what `--print` lists (`REF ARCHIVE`, the archive `NAME-KEY.oci.tar`)."""
    listed = images.parse_print_output(print_output(images.BUILD_SCRIPT, timeout=120))
    names = [Path(i.archive).name.removesuffix(".oci.tar").rsplit("-", 1)[0] for i in listed]
    assert tuple(names) == IMAGE_NAMES
    assert set(IMAGE_NAMES) - LLAMA_IMAGES == {"ollama"}


@pytest.mark.engine  # the images' listing reads what the engine builds made
def test_otherwise_the_parts_and_images_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINES_BUILDING, raising=False)
    assert engines.path("ollama").name == "ollama"
    assert any(i.reference.startswith("registry.k8s.io/pause:") for i in images.list_images())


def runs() -> list[tuple[str, str]]:
    """(ENGINES_BUILDING value or '', -m expression) of each pytest run in test.sh,
    the unit tier's first."""
    found = re.findall(r'(?:LOCALMODEL_ENGINES_BUILDING=(\w+) )?python -m pytest '
                       r'--durations=\d+ (?:\\\n\s*)?-m "([^"]*)"', SCRIPT)
    return [(env, expr) for env, expr in found]


def test_test_sh_gives_every_test_exactly_one_run_and_its_building_value() -> None:
    found = runs()
    assert [env for env, _ in found] == ["", "all", "ollama", ""], found
    assert set(BUILDING) == {"all", "ollama"}
    for values in itertools.product([False, True], repeat=len(MARKERS)):
        marks = dict(zip(MARKERS, values, strict=True))
        chosen = [expr for _, expr in found if eval(expr, {}, marks)]
        assert len(chosen) == 1, (marks, chosen)
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    markers = {m.split(":")[0] for m in declared["tool"]["pytest"]["ini_options"]["markers"]}
    assert set(MARKERS) <= markers
