"""tinyserve's adapter, pod part (localmodel.engines.pod): the download step
(the operator image's python, as the shared GGUF step runs it), the step that
writes its JSON config file, and the server reading it, with its health path
as probes."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from localmodel.api import LocalModel
from localmodel.contract import CONTAINER_DOWNLOAD, PORT_ENGINE, VOLUME_WEIGHTS
from localmodel.engines.gguf import Download, download_bound, gguf_script, python_fetch
from localmodel.engines.pod import (
    EngineContainers,
    PlacedReplica,
    PodOptions,
    engine_env,
    engine_resources,
)
from localmodel.podspec import NONROOT_UID, Manifest, container_security, restricted_pod
from localmodel.rules.model import Tuning
from tests.engines.tinyserve import (
    BINARY,
    CONFIG_DIR,
    CONFIG_FILE,
    HEALTH_PATH,
    MODELS_DIR,
    NAME,
    PORT,
    SHELL,
)

CONTAINER_CONFIGURE = "configure"
VOLUME_CONFIG = "tinyserve-config"


def config_document(tuning: Tuning) -> str:
    """Its config file: the tuning's `key=value` entries as one JSON object
    (whole numbers as numbers)."""
    entries = dict(entry.split("=", 1) for entry in tuning.args)
    return json.dumps({k: int(v) if v.isdigit() else v for k, v in entries.items()},
                      sort_keys=True)


def _mounts(weights_read_only: bool, config_read_only: bool) -> list[Manifest]:
    weights: Manifest = {"name": VOLUME_WEIGHTS, "mountPath": MODELS_DIR}
    config: Manifest = {"name": VOLUME_CONFIG, "mountPath": CONFIG_DIR}
    return [weights | ({"readOnly": True} if weights_read_only else {}),
            config | ({"readOnly": True} if config_read_only else {})]


def _security() -> Manifest:
    return container_security(read_only_root=True, uid=NONROOT_UID)


def _probe(loopback: bool, **extra: int) -> Manifest:
    """Its health path: asked by its own binary from inside the container when
    it listens on loopback (behind the gateway), else over HTTP."""
    if loopback:
        return {"exec": {"command": [BINARY, "check", CONFIG_FILE]}, **extra}
    return {"httpGet": {"path": HEALTH_PATH, "port": PORT_ENGINE}, **extra}


def _base(lm: LocalModel, t: Tuning, options: PodOptions, name: str) -> Manifest:
    return {
        "name": name,
        "image": lm.spec.engine.resolved_image(options.image_registry),
        "imagePullPolicy": options.pull_policy,
        "resources": engine_resources(t),
        "securityContext": _security(),
    }


def configure_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """Writes the config file the server reads (its only way of being told)."""
    write = f"printf '%s\\n' {shlex.quote(config_document(t))} > {CONFIG_FILE}"
    return _base(lm, t, options, CONTAINER_CONFIGURE) | {
        "command": [SHELL, "-c", write],
        "volumeMounts": _mounts(weights_read_only=True, config_read_only=False),
    }


def download_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """The GGUF file once onto the weights volume, checked (the shared step)."""
    assert lm.spec.gguf is not None  # the API requires it (NEEDS_GGUF)
    download = Download(download_bound(t.memory_bytes, t.storage_bytes),
                        allow_http=options.allow_http_downloads)
    path = f"{MODELS_DIR}/{lm.spec.gguf.file_name()}"
    script = gguf_script(lm.spec.gguf, path, f"{path}.part", f"{path}.sha256",
                         python_fetch(lm.spec.gguf.url, download), download)
    return {
        "name": CONTAINER_DOWNLOAD,
        "image": options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": [SHELL, "-c", script],
        "resources": engine_resources(t),
        "volumeMounts": _mounts(weights_read_only=False, config_read_only=True),
        "securityContext": _security(),
    }


def server_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    loopback = lm.spec.gateway.enabled
    server = _base(lm, t, options, NAME) | {
        "command": [BINARY, CONFIG_FILE],
        "env": engine_env(lm, t),
        "ports": [{"name": PORT_ENGINE, "containerPort": PORT, "protocol": "TCP"}],
        "volumeMounts": _mounts(weights_read_only=True, config_read_only=True),
        "startupProbe": _probe(loopback, periodSeconds=2, failureThreshold=150),
        "livenessProbe": _probe(loopback, periodSeconds=10, failureThreshold=3),
    }
    if not loopback:
        server["readinessProbe"] = _probe(loopback, periodSeconds=5)
    return server


class TinyServePod:
    """tinyserve: its containers, init steps, readiness and health. Its config
    file lives on a small in-memory volume its init step writes: no ConfigMap."""

    port = PORT
    has_config = False

    @property
    def pod_security(self) -> Manifest:
        return {**restricted_pod(), "fsGroupChangePolicy": "OnRootMismatch"}

    def containers(self, lm: LocalModel, tuning: Tuning, options: PodOptions) -> EngineContainers:
        inits = [download_container(lm, tuning, options), configure_container(lm, tuning, options)]
        return EngineContainers(inits, server_container(lm, tuning, options))

    def config_data(self, lm: LocalModel, replicas: Sequence[PlacedReplica]) -> dict[str, str]:
        return {}

    def config_key(self, replica: int) -> str:
        return ""

    def config_volumes(self, configmap: str, key: str) -> list[Manifest]:
        return [{"name": VOLUME_CONFIG, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
