"""llama_server's adapter, pod part (engines/pod.py): the server with the
rules' flags, its probes, and the step that downloads the GGUF file."""

from __future__ import annotations

from collections.abc import Sequence

from localmodel.api import GGUF, LocalModel
from localmodel.contract import CONTAINER_DOWNLOAD, PORT_ENGINE, VOLUME_WEIGHTS
from localmodel.engines import llama_server
from localmodel.engines.gguf import Download, curl_fetch, download_bound, gguf_script
from localmodel.engines.pod import (
    EngineContainers,
    PlacedReplica,
    PodOptions,
    engine_env,
    engine_resources,
)
from localmodel.podspec import (
    NONROOT_UID,
    Manifest,
    container_security,
    probe_periods,
    restricted_pod,
    startup_probe_timing,
)
from localmodel.rules.model import Tuning


def gguf_init_script(
    gguf: GGUF, download: Download, directory: str = llama_server.MODELS_DIR
) -> str:
    """llama-server's download step: the GGUF file once into `directory`
    (`gguf_script`, with the image's curl), checked by `<file>.sha256`, landing
    in `<file>.part`."""
    path = f"{directory}/{gguf.file_name()}"
    fetch = curl_fetch(gguf.url, download)
    return gguf_script(gguf, path, f"{path}.part", f"{path}.sha256", fetch, download)


def _probe(loopback: bool, **extra: int) -> Manifest:
    """llama-server's /health as a probe. The kubelet dials the pod's IP, so an
    engine bound to loopback (behind the gateway) is asked from inside its
    container with the image's curl (llama.cpp's server image has it for its
    own HEALTHCHECK); an engine on all addresses gets a plain httpGet."""
    if loopback:
        url = f"http://127.0.0.1:{llama_server.PORT}{llama_server.HEALTH_PATH}"
        return {"exec": {"command": ["curl", "-fsS", "-o", "/dev/null", "--max-time", "4", url]},
                **extra}
    return {"httpGet": {"path": llama_server.HEALTH_PATH, "port": PORT_ENGINE}, **extra}


def _mounts(read_only: bool) -> list[Manifest]:
    """The weights volume: the server only reads it, the download step writes it."""
    mount: Manifest = {"name": VOLUME_WEIGHTS, "mountPath": llama_server.MODELS_DIR}
    return [mount | {"readOnly": True}] if read_only else [mount]


# Pod Security `restricted` (docs/operator.md, Pod Security): every container
# runs as NONROOT_UID with no capabilities on a read-only root filesystem.
# llama-server writes nothing but what it is told to (no --slot-save-path,
# no -hf cache); the download step writes only the volume, which `fsGroup`
# makes its group's (changed once: OnRootMismatch keeps the file's change
# time, which the checksum record is bound to).
def _container_security() -> Manifest:
    return container_security(read_only_root=True, uid=NONROOT_UID)


def server_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """llama-server: the rules' flags, whole CPUs, the GGUF on the weights volume.

    /health answers 503 while the model loads: the startup probe gives the
    model the time its rules decided (`Tuning.startup_seconds`, from its
    expected load) before liveness counts; without the gateway /health is
    also the readiness probe.
    """
    loopback = lm.spec.gateway.enabled  # the rules bind it to 127.0.0.1 behind the gateway
    periods = probe_periods(lm.spec.idle is not None)
    engine: Manifest = {
        "name": llama_server.NAME,
        "image": lm.spec.engine.resolved_image(options.image_registry),
        "imagePullPolicy": options.pull_policy,
        "args": list(t.args),
        "env": engine_env(lm, t),
        "ports": [{"name": PORT_ENGINE, "containerPort": llama_server.PORT, "protocol": "TCP"}],
        "resources": engine_resources(t),
        "volumeMounts": _mounts(read_only=True),
        "securityContext": _container_security(),
        "startupProbe": _probe(loopback, timeoutSeconds=5,
                               **startup_probe_timing(t.startup_seconds, periods.startup)),
        "livenessProbe": _probe(loopback, periodSeconds=periods.liveness, timeoutSeconds=5,
                                failureThreshold=6),
    }
    if not loopback:
        engine["readinessProbe"] = _probe(loopback, **periods.readiness_fields(),
                                          timeoutSeconds=5)
    return engine


def download_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """Downloads the GGUF file when the volume lacks it (`gguf_init_script`)."""
    assert lm.spec.gguf is not None  # the API requires it for llama-server
    download = Download(download_bound(t.memory_bytes, t.storage_bytes),
                        allow_http=options.allow_http_downloads)
    return {
        "name": CONTAINER_DOWNLOAD,
        "image": lm.spec.engine.resolved_image(options.image_registry),
        "imagePullPolicy": options.pull_policy,
        "command": [llama_server.SHELL, "-c", gguf_init_script(lm.spec.gguf, download)],
        "resources": engine_resources(t),
        "volumeMounts": _mounts(read_only=False),
        "securityContext": _container_security(),
    }


class LlamaServerPod:
    """llama_server: its containers, init steps, readiness and health. It
    reads its settings from its flags: its pods mount no ConfigMap."""

    port = llama_server.PORT
    has_config = False

    @property
    def pod_security(self) -> Manifest:
        return {**restricted_pod(), "fsGroupChangePolicy": "OnRootMismatch"}

    def containers(self, lm: LocalModel, tuning: Tuning, options: PodOptions) -> EngineContainers:
        return EngineContainers(
            [download_container(lm, tuning, options)], server_container(lm, tuning, options)
        )

    def config_data(self, lm: LocalModel, replicas: Sequence[PlacedReplica]) -> dict[str, str]:
        return {}

    def config_key(self, replica: int) -> str:
        return ""

    def config_volumes(self, configmap: str, key: str) -> list[Manifest]:
        return []
