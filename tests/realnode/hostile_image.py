"""A tenant's hostile gateway image, built here for the containment journey.

FROM the operator image (the archive hack/build-images.sh built) plus one
layer: `/usr/local/bin/localmodel` replaced by tests/realnode/hostile_speed_server.py,
so the gateway container the renderer starts (`command: [localmodel, gateway]`)
runs the hostile server instead. Written as an OCI archive in Python (the
operator's blobs copied, a new uncompressed layer, a new config and manifest),
so no image builder runs; the containment journey pushes it to the test registry,
from which the real node pulls it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT
from tests.harness.images import REF_NAME

SERVER = Path(__file__).with_name("hostile_speed_server.py")
ENTRY = "usr/local/bin/localmodel"
REFERENCE = "localhost/localmodel-test/hostile-gateway:1"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/")


def _layer() -> bytes:
    script = SERVER.read_text().replace("PORT = 8080 ", f"PORT = {GATEWAY_PORT} ", 1).replace(
        "ADMIN_PORT = 8090 ", f"ADMIN_PORT = {ADMIN_PORT} ", 1)
    data = script.encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(ENTRY)
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    out.addfile(info, io.BytesIO(data))


def build(operator_archive: Path, dest: Path, reference: str = REFERENCE) -> Path:
    """Write the hostile image as a one-image OCI archive at `dest`."""
    layer = _layer()
    with tarfile.open(operator_archive) as src, tarfile.open(dest, "w") as out:
        index = json.load(src.extractfile("index.json"))  # type: ignore[arg-type]
        [entry] = index["manifests"]
        manifest: dict[str, Any] = json.load(src.extractfile(_blob(entry["digest"])))  # type: ignore[arg-type]
        config: dict[str, Any] = json.load(
            src.extractfile(_blob(manifest["config"]["digest"])))  # type: ignore[arg-type]
        for member in src.getmembers():  # the base's layers, as they are
            if member.isfile() and member.name.startswith("blobs/") and any(
                    member.name == _blob(layer_["digest"]) for layer_ in manifest["layers"]):
                out.addfile(member, src.extractfile(member))
        layer_digest = _digest(layer)
        _add(out, _blob(layer_digest), layer)
        config["rootfs"]["diff_ids"].append(layer_digest)
        config.setdefault("history", []).append(
            {"created_by": "tests/realnode/hostile_image.py: a hostile /speed server"})
        config_bytes = json.dumps(config).encode()
        _add(out, _blob(_digest(config_bytes)), config_bytes)
        manifest["config"] = {**manifest["config"], "digest": _digest(config_bytes),
                              "size": len(config_bytes)}
        manifest["layers"] = [*manifest["layers"], {
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest, "size": len(layer)}]
        manifest.pop("annotations", None)
        manifest_bytes = json.dumps(manifest).encode()
        _add(out, _blob(_digest(manifest_bytes)), manifest_bytes)
        _add(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(out, "index.json", json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _digest(manifest_bytes), "size": len(manifest_bytes),
            "annotations": {REF_NAME: reference}}]}).encode())
    return dest
