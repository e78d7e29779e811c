"""The pause image of the test cluster's real node, built here (no registry to pull from).

containerd starts every pod sandbox from its configured `sandbox_image`. This
builds tests/harness/pause.c with `gcc -static` and writes a one-layer OCI
image archive for `ctr images import`, named `PAUSE_IMAGE` (a local name, so
nothing pretends to be registry.k8s.io/pause). The archive is cached by the
content of pause.c, so it is built once per change of the source.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from tests.harness.tools import REPO_ROOT

SOURCE = REPO_ROOT / "tests" / "harness" / "pause.c"
_SOURCE_DIGEST = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
PAUSE_IMAGE = f"localhost/localmodel-test/pause:{_SOURCE_DIGEST[:12]}"

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


class PauseBuildError(RuntimeError):
    pass


def pause_archive(cache: Path) -> Path:
    """The OCI archive of PAUSE_IMAGE under `cache`, built if missing."""
    archive = cache / f"pause-{_SOURCE_DIGEST[:12]}.oci.tar"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pause-", dir=cache) as tmp:
        binary = Path(tmp) / "pause"
        try:
            subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(binary), str(SOURCE)],
                           check=True, capture_output=True, text=True, timeout=120)
        except FileNotFoundError as exc:
            raise PauseBuildError("`gcc` is not installed (Debian: gcc, libc6-dev)") from exc
        except subprocess.CalledProcessError as exc:
            raise PauseBuildError(f"gcc -static {SOURCE} failed: {exc.stderr.strip()}") from exc
        partial = Path(tmp) / "pause.oci.tar"
        partial.write_bytes(oci_archive(PAUSE_IMAGE, {"pause": binary.read_bytes()},
                                        entrypoint=["/pause"]))
        partial.replace(archive)
    return archive


def _tar(files: dict[str, bytes]) -> bytes:
    """A reproducible tar of executables (root-owned, mtime 0)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def oci_archive(name: str, files: dict[str, bytes], entrypoint: list[str]) -> bytes:
    """A single-platform (linux/amd64) OCI image layout as a tar, `name` as its reference."""
    blobs: dict[str, bytes] = {}
    layer = _tar(files)
    layer_desc = _blob(blobs, layer, LAYER)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = _blob(blobs, json.dumps(config, sort_keys=True).encode(), CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_desc,
                "layers": [layer_desc]}
    manifest_desc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(), MANIFEST)
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name,
    }
    files_out = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode(),
    }
    for digest, data in blobs.items():
        files_out["blobs/sha256/" + digest.removeprefix("sha256:")] = data
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files_out.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
