"""ollama's adapter, pod part (engines/pod.py): the server with the tuned
environment, the init step that pulls the weights and builds the tuned model
from its Modelfile (the model's ConfigMap), and, with `gguf`, the step that
downloads the file into Ollama's store.

The init step is a readable file beside this module, `init.sh`, with its
weights part `pull.sh` (from the registry) or `from-gguf.sh` (from the
downloaded file), loaded as templates: `$`-names are the shell's, `{braces}`
are filled in (quoted) by `init_script` (a brace the shell needs would be
written `{{`). `init.sh` starts `ollama serve` for the init step and stops it
on every way out: a failed pull or create (set -e), a signal, or the end of
the script.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from localmodel.api import GGUF, LocalModel
from localmodel.contract import (
    CONTAINER_DOWNLOAD,
    CONTAINER_PULL,
    PORT_ENGINE,
    VOLUME_MODELFILE,
    VOLUME_WEIGHTS,
)
from localmodel.engines import ollama
from localmodel.engines.gguf import (
    OPERATOR_SHELL,
    Download,
    download_bound,
    gguf_script,
    python_fetch,
    script_text,
)
from localmodel.engines.pod import (
    EngineContainers,
    PlacedReplica,
    PodOptions,
    engine_env,
    engine_resources,
)
from localmodel.podspec import Manifest, container_security, env_list, probe_periods, seccomp
from localmodel.rules.model import Tuning

# Where the engine and its init step mount the model's Modelfile.
MODELFILE_DIR = "/etc/localmodel"
# Under the weights volume: where Ollama's download step keeps its part file
# and checksum record.
DOWNLOAD_DIR = "download"

_PACKAGE = "localmodel.engines.ollama"
INIT = script_text(_PACKAGE, "init.sh")
PULL = script_text(_PACKAGE, "pull.sh")
FROM_GGUF = script_text(_PACKAGE, "from-gguf.sh")


def modelfile(lm: LocalModel, tuning: Tuning) -> str:
    """The tuned Modelfile: the operator's parameters layered on top of the
    pulled model of the same name, or, with `gguf`, on the GGUF file the
    download step put into Ollama's store.

    No Ollama variable sets threads; a Modelfile PARAMETER does (ollama
    api/types.go), and it applies to every caller, gateway or not.
    """
    source = lm.spec.model if lm.spec.gguf is None else ollama_gguf_blob(lm.spec.gguf)
    lines = [f"FROM {source}"]
    lines += [f"PARAMETER {k} {v}" for k, v in sorted(tuning.modelfile.items())]
    return "\n".join(lines) + "\n"


def init_script(lm: LocalModel, tuning: Tuning) -> str:
    """Pull only when the weights are not on the volume, then build the tuned model.

    With `gguf` there is no pull at all: the download step has put the file
    into Ollama's store, and the Modelfile's FROM names it there.
    """
    model = shlex.quote(lm.spec.model)
    remove = "".join(f"rm -f {shlex.quote(p)}\n" for p in tuning.remove_libraries)
    if lm.spec.gguf is not None:
        weights = FROM_GGUF.format(model=model, file=shlex.quote(lm.spec.gguf.file_name()))
    else:
        weights = PULL.format(model=model)
    return INIT.format(
        remove=remove, weights=weights, model=model, modelfile=f"{MODELFILE_DIR}/Modelfile"
    )


def ollama_gguf_blob(gguf: GGUF, models: str = ollama.MODELS_DIR) -> str:
    """Where Ollama's store keeps the file: `blobs/sha256-<hex>`, named by its
    checksum (docs/engine-facts.md#weights-imported-from-a-gguf-file)."""
    return f"{models}/blobs/sha256-{gguf.sha256}"


def ollama_gguf_script(gguf: GGUF, download: Download, home: str = ollama.HOME) -> str:
    """Ollama's download step: the same checks as llama-server's, but the file
    lands as the blob Ollama's store would make of it, so `ollama create`
    FROM it finds the blob there and copies nothing: the weights are on the
    volume once. The part file and the checksum record stay outside the
    store (Ollama's prune removes files there that are not blobs)."""
    stage = f"{home}/{DOWNLOAD_DIR}/{gguf.file_name()}"
    blob = ollama_gguf_blob(gguf, f"{home}/models")
    fetch = python_fetch(gguf.url, download)
    return gguf_script(gguf, blob, f"{stage}.part", f"{stage}.sha256", fetch, download)


def _command(tuning: Tuning) -> dict[str, Any]:
    """The server's start: `ollama serve`, after removing the libraries the
    rules remove (`Tuning.remove_libraries`), if any."""
    if not tuning.remove_libraries:
        return {"args": [ollama.SERVE]}
    removal = " ".join(shlex.quote(p) for p in tuning.remove_libraries)
    start = f"rm -f {removal}; exec {ollama.BINARY} {ollama.SERVE}"
    return {"command": [ollama.SHELL, "-c", start]}


def _mounts(read_only: bool) -> list[Manifest]:
    """The weights volume (Ollama's home: its store and key) and the
    Modelfile. `ollama serve` only reads its home once the init step has
    written the store and the key (it serves from a read-only one:
    tests/engines/test_ollama_gguf.py); the init steps write it."""
    weights: Manifest = {"name": VOLUME_WEIGHTS, "mountPath": ollama.HOME}
    return [
        weights | {"readOnly": True} if read_only else weights,
        {"name": VOLUME_MODELFILE, "mountPath": MODELFILE_DIR, "readOnly": True},
    ]


# Pod Security `baseline`, not `restricted` (docs/operator.md, Pod Security):
# Ollama's image runs as root with its home, the weights volume, at
# /root/.ollama (/root is root's alone), and its init steps write that
# volume. What `restricted` asks besides a non-root user holds: the runtime's
# seccomp profile, no capabilities (root owns what it writes: it needs none),
# no privilege escalation. The root filesystem stays writable: the rules may
# remove a CPU library at start (Tuning.remove_libraries) and the init step
# logs to /tmp.
def _container_security() -> Manifest:
    return container_security(read_only_root=False)


def server_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """The Ollama server: the tuned environment, whole CPUs, the weights volume.

    Without the gateway it is what the Service targets, so it has the readiness
    probe; with it the gateway's probe speaks for the pod.
    """
    engine: Manifest = {
        "name": ollama.NAME,  # the engine container is named after its engine
        "image": lm.spec.engine.resolved_image(options.image_registry),
        "imagePullPolicy": options.pull_policy,
        **_command(t),
        "env": engine_env(lm, t),
        "ports": [{"name": PORT_ENGINE, "containerPort": ollama.PORT, "protocol": "TCP"}],
        "resources": engine_resources(t),
        "volumeMounts": _mounts(read_only=True),
        "securityContext": _container_security(),
    }
    if not lm.spec.gateway.enabled:
        engine["readinessProbe"] = {
            "httpGet": {"path": ollama.HEALTH_PATH, "port": PORT_ENGINE},
            **probe_periods(lm.spec.idle is not None).readiness_fields(),
        }
    return engine


def pull_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """Pulls the weights when the volume lacks them and builds the tuned model
    (`init_script`), with the engine's image, resources and mounts."""
    return {
        "name": CONTAINER_PULL,
        "image": lm.spec.engine.resolved_image(options.image_registry),
        "imagePullPolicy": options.pull_policy,
        "command": [ollama.SHELL, "-c", init_script(lm, t)],
        "env": env_list(
            {k: v for k, v in t.env.items() if k in ("OLLAMA_MODELS", "GOMAXPROCS")}
            | {"OLLAMA_HOST": f"127.0.0.1:{ollama.PORT}"}
            # The downloaded blob is not in any manifest until `ollama create`
            # ran: the init step's server must not prune it at start.
            | ({ollama.NOPRUNE: "1"} if lm.spec.gguf is not None else {})
        ),
        "resources": engine_resources(t),
        "volumeMounts": _mounts(read_only=False),
        "securityContext": _container_security(),
    }


def download_container(lm: LocalModel, t: Tuning, options: PodOptions) -> Manifest:
    """Downloads `gguf` into Ollama's store when the volume lacks it
    (`ollama_gguf_script`). Ollama's image has no downloader, so this step runs
    in the operator image; as root, like Ollama's own containers, since the
    volume's files are Ollama's (root's), with no capabilities, on a read-only
    root filesystem (it writes the volume only)."""
    assert lm.spec.gguf is not None
    download = Download(download_bound(t.memory_bytes, t.storage_bytes),
                        allow_http=options.allow_http_downloads)
    return {
        "name": CONTAINER_DOWNLOAD,
        "image": options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": [OPERATOR_SHELL, "-c", ollama_gguf_script(lm.spec.gguf, download)],
        "securityContext": {
            **container_security(read_only_root=True), "runAsUser": 0, "runAsGroup": 0,
        },
        "resources": engine_resources(t),
        "volumeMounts": [{"name": VOLUME_WEIGHTS, "mountPath": ollama.HOME}],
    }


class OllamaPod:
    """ollama: its containers, init steps, readiness and health. Its pods
    mount their replica's Modelfile from the model's ConfigMap."""

    port = ollama.PORT
    has_config = True

    @property
    def pod_security(self) -> Manifest:
        return seccomp()

    def containers(self, lm: LocalModel, tuning: Tuning, options: PodOptions) -> EngineContainers:
        inits = [pull_container(lm, tuning, options)]
        if lm.spec.gguf is not None:
            inits.insert(0, download_container(lm, tuning, options))
        return EngineContainers(inits, server_container(lm, tuning, options))

    def config_data(self, lm: LocalModel, replicas: Sequence[PlacedReplica]) -> dict[str, str]:
        """Each replica's Modelfile, by the key its pod mounts."""
        return {self.config_key(r.replica): modelfile(lm, r.tuning) for r in replicas}

    def config_key(self, replica: int) -> str:
        return f"replica-{replica}.Modelfile"

    def config_volumes(self, configmap: str, key: str) -> list[Manifest]:
        """Its Modelfile, from the model's ConfigMap."""
        return [
            {
                "name": VOLUME_MODELFILE,
                "configMap": {"name": configmap, "items": [{"key": key, "path": "Modelfile"}]},
            }
        ]
