"""The images a real test node runs: `hack/build-images.sh --print`, the one
place their references and archive paths live, and a reader for the archives
(OCI image layout in a tar, as `buildah push ... oci-archive:` writes it)."""

from __future__ import annotations

import json
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.prereqs import given_images
from tests.harness.tools import print_output

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-images.sh"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Image:
    """An image reference and the OCI archive that holds it under that reference."""

    reference: str
    archive: Path


def parse_print_output(text: str) -> list[Image]:
    """`REFERENCE ARCHIVE` lines: the reference has no spaces, the archive is
    the rest of the line, an absolute path."""
    images = []
    for number, line in enumerate(text.splitlines(), 1):
        reference, sep, archive = line.partition(" ")
        if not sep or not reference or not archive.startswith("/"):
            raise ValueError(
                f"hack/build-images.sh --print, line {number}: {line!r} is not "
                "'REFERENCE /absolute/archive/path'"
            )
        images.append(Image(reference, Path(archive)))
    return images


def list_images(*names: str) -> list[Image]:
    """The images `hack/build-images.sh --print [NAME...]` lists (builds nothing);
    with no names, every one this run may use (tests/harness/prereqs.py)."""
    given = given_images(names)
    return parse_print_output(print_output(BUILD_SCRIPT, args=given, timeout=120))


@dataclass(frozen=True)
class ArchivedImage:
    """What an OCI archive holds: the reference it names, the image config and
    the union of its layers' paths (absolute; symlinks with their targets)."""

    reference: str
    config: dict[str, Any]
    files: frozenset[str]
    links: dict[str, str]

    def resolve(self, path: str) -> str | None:
        """`path` with every symlink in it followed, if it leads to a file or
        directory in the image; else None."""
        parts = [p for p in path.split("/") if p]
        done = "/"
        for _ in range(64):
            if not parts:
                return done if done == "/" or done in self.files else None
            step = posixpath.join(done, parts.pop(0))
            target = self.links.get(step)
            if target is None:
                done = step
                continue
            base = "/" if target.startswith("/") else done
            followed = posixpath.normpath(posixpath.join(base, target))
            parts = [p for p in followed.split("/") if p] + parts
            done = "/"
        return None


def read_archive(archive: Path) -> ArchivedImage:
    """Read a one-image OCI archive: its reference, config and file list."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> tarfile.ExFileObject:
            member = outer.extractfile(_blob_name(digest))
            assert member is not None, f"{archive}: no blob {digest}"
            return member

        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        [entry] = index["manifests"]
        manifest = json.load(blob(entry["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        files: set[str] = set()
        links: dict[str, str] = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as t:
                for m in t:
                    name = "/" + m.name.removeprefix("./").strip("/")
                    files.add(name)
                    if m.issym():
                        links[name] = m.linkname
                    elif m.islnk():
                        links[name] = "/" + m.linkname.removeprefix("./").lstrip("/")
    return ArchivedImage(
        reference=entry.get("annotations", {}).get(REF_NAME, ""),
        config=config.get("config", {}),
        files=frozenset(files),
        links=links,
    )


def read_file(archive: Path, path: str) -> bytes:
    """The content of the regular file `path` in the image's top-most layer holding it."""
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        [entry] = index["manifests"]
        manifest = json.load(outer.extractfile(_blob_name(entry["digest"])))  # type: ignore[arg-type]
        found: bytes | None = None
        for layer in manifest["layers"]:
            layer_file = outer.extractfile(_blob_name(layer["digest"]))
            with tarfile.open(fileobj=layer_file, mode="r|*") as t:
                for m in t:
                    if "/" + m.name.removeprefix("./").strip("/") == path and m.isfile():
                        data = t.extractfile(m)
                        assert data is not None
                        found = data.read()
    if found is None:
        raise FileNotFoundError(f"{archive}: no file {path} in any layer")
    return found


def _blob_name(digest: str) -> str:
    return f"blobs/{digest.replace(':', '/')}"
