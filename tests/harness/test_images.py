"""hack/build-images.sh: what it lists is what the chart, the renderer and the
docs point at, and every archive holds its image with the layout the rendered
pods rely on. The archive checks need the images built (hack/test.sh builds
them before the tests; a missing archive fails, naming the command)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
import yaml

from localmodel import engines
from localmodel.api import DEFAULT_IMAGES, EngineName
from localmodel.engines import llama_server, ollama
from localmodel.render.names import DEFAULT_OPERATOR_IMAGE
from tests.harness.images import (
    REPO_ROOT,
    ArchivedImage,
    Image,
    list_images,
    parse_print_output,
    read_archive,
    read_file,
)
from tests.harness.processes import ManagedProcess

CHART = REPO_ROOT / "charts" / "localmodel-operator"
# What hack/build-images.sh built (its listing depends on the engine builds).
pytestmark = pytest.mark.engine

NAMES = ("operator", "ollama", "llama-server", "pause", "helper")
STAND_IN = "dev.localmodel.stand-in"


@functools.cache
def printed() -> dict[str, Image]:
    """`--print NAME` per image name: one line each."""
    out: dict[str, Image] = {}
    for name in NAMES:
        [image] = list_images(name)
        out[name] = image
    return out


def chart_default_image() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


def test_print_lists_every_image_once_in_a_parseable_line() -> None:
    images = list_images()
    assert images == [printed()[n] for n in NAMES]  # `--print` = the per-name lines, in order
    assert len({i.reference for i in images}) == len(images)
    assert len({i.archive for i in images}) == len(images)
    for image in images:
        assert image.archive.name.endswith(".oci.tar"), image


@pytest.mark.parametrize(
    "line",
    ["", "registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10 relative/path.tar", " /a.tar"],
)
def test_a_malformed_print_line_is_refused_with_its_number(line: str) -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_print_output(f"a:1 /x.oci.tar\n{line}\n")


def test_an_archive_path_may_hold_spaces() -> None:
    [image] = parse_print_output("registry.k8s.io/pause:3.10 /home/a b/pause-1.oci.tar\n")
    assert image == Image("registry.k8s.io/pause:3.10", Path("/home/a b/pause-1.oci.tar"))


def test_the_references_are_what_the_chart_and_the_renderer_run() -> None:
    # The chart's default image is the operator image built here, and the
    # renderer's gateway image is the same; the renderer's pinned engine images
    # are the stand-ins built here (so renaming or bumping one without the
    # build fails here, not on the test node).
    refs = printed()
    assert refs["operator"].reference == chart_default_image() == DEFAULT_OPERATOR_IMAGE
    assert refs["ollama"].reference == ollama.IMAGE == DEFAULT_IMAGES[EngineName.OLLAMA]
    assert (
        refs["llama-server"].reference
        == llama_server.IMAGE
        == DEFAULT_IMAGES[EngineName.LLAMA_SERVER]
    )
    shipped = {DEFAULT_IMAGES[EngineName(f.NAME)] for f in engines.SHIPPED}  # not a test-only one
    assert shipped <= {i.reference for i in refs.values()}


def test_docs_list_every_image_built_for_the_test_node() -> None:
    doc = (REPO_ROOT / "docs" / "test-cluster.md").read_text()
    # By repository: a version bump need not touch the doc.
    missing = [
        i.reference
        for i in printed().values()
        if f"`{i.reference}`" not in doc and f"`{i.reference.rsplit(':', 1)[0]}`" not in doc
    ]
    assert not missing, f"docs/test-cluster.md does not list {missing}"


@functools.cache
def archived(name: str) -> ArchivedImage:
    image = printed()[name]
    if not image.archive.is_file():
        pytest.fail(
            f"{image.reference}: no archive at {image.archive}. "
            "Build the images with: bash hack/build-images.sh",
            pytrace=False,
        )
    return read_archive(image.archive)


@pytest.mark.parametrize("name", NAMES)
def test_each_archive_holds_its_image_under_its_reference(name: str) -> None:
    assert archived(name).reference == printed()[name].reference


def on_path(image: ArchivedImage, command: str) -> bool:
    env = dict(e.split("=", 1) for e in image.config.get("Env", []))
    return any(image.resolve(f"{d}/{command}") for d in env.get("PATH", "").split(":") if d)


def test_the_operator_image_runs_localmodel_as_non_root() -> None:
    image = archived("operator")
    assert image.config["Entrypoint"] == ["localmodel"]
    assert image.config["User"] == "65532:65532"
    assert on_path(image, "localmodel")
    assert image.resolve("/usr/lib/python3.11")  # the Debian 12 base's Python


def test_the_ollama_image_has_the_layout_the_rendered_pod_runs() -> None:
    image = archived("ollama")
    # The engine container passes only args (`serve`), or runs /bin/sh -c
    # '... exec /bin/ollama serve'; the init script calls `ollama` on PATH.
    assert image.config["Entrypoint"] == [ollama.BINARY]
    assert image.config["Cmd"] == [ollama.SERVE]
    assert image.resolve(ollama.BINARY)
    assert image.resolve("/bin/sh")
    assert on_path(image, "ollama")
    # Ollama finds its runner and CPU libraries at <executable>/../lib/ollama.
    assert image.resolve("/usr/lib/ollama/llama-server")
    assert posixpath_dir(ollama.AMX_LIBRARY) == "/usr/lib/ollama"
    # The upstream image has no curl, so neither has the stand-in.
    assert not on_path(image, "curl")
    # A stand-in says so, and holds the Ollama the renderer pins.
    assert f"Ollama {ollama.VERSION} " in image.config["Labels"][STAND_IN]


def test_the_llama_server_image_has_what_the_init_script_and_container_use() -> None:
    image = archived("llama-server")
    assert image.config["Entrypoint"] == [llama_server.BINARY]
    assert not image.config.get("Cmd")
    assert image.resolve(llama_server.BINARY)
    assert image.resolve(llama_server.SHELL)
    for command in ("curl", "sha256sum", "cut", "cat", "mv", "rm"):  # gguf_init_script's
        assert on_path(image, command), command
    # A stand-in says so, and holds the llama.cpp tree the tests run (the tag's
    # build number is the nearest upstream one, see engines/llama_server/__init__.py).
    label = image.config["Labels"][STAND_IN]
    assert f"{llama_server.TESTED_SOURCE} {llama_server.TESTED_VERSION} " in label


def test_the_pause_image_is_one_static_binary_that_waits_for_sigterm(tmp_path: Path) -> None:
    image = archived("pause")
    assert image.config["Entrypoint"] == ["/pause"]
    assert image.resolve("/pause")
    assert not image.resolve("/bin/sh")
    assert "not the upstream image" in image.config["Labels"][STAND_IN]
    # The binary itself: static (runs without the image's libc, there is
    # none), sleeps, and exits 0 on SIGTERM as the sandbox's stop expects.
    binary = tmp_path / "pause"
    binary.write_bytes(read_file(printed()["pause"].archive, "/pause"))
    binary.chmod(0o755)
    proc = ManagedProcess("pause", [str(binary)], tmp_path / "pause.log")
    proc.start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert proc.stop(timeout=5) == 0  # SIGTERM, then its exit code
    finally:
        proc.kill()


def test_the_helper_image_has_the_shell_and_tools_the_local_path_scripts_use() -> None:
    image = archived("helper")
    # The provisioner runs `/bin/sh /script/setup` (mkdir -m 0777 -p) and
    # `/bin/sh /script/teardown` (rm -rf) in it.
    assert image.resolve("/bin/sh") and image.resolve("/bin/busybox")
    for command in ("sh", "mkdir", "rm"):
        assert on_path(image, command), command
    assert image.links["/bin/sh"] == "/bin/busybox"
    assert "busybox-static" in image.config["Labels"][STAND_IN]


def posixpath_dir(path: str) -> str:
    return path.rsplit("/", 1)[0]
