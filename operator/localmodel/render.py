"""Pure renderer: a LocalModel, its placements and their tunings -> manifests.

No client, no clock: the caller passes the time and the operator image. Every
object carries the `localmodel.dev/name` label; pods, the Service and the
ConfigMap are owned by the LocalModel (garbage-collected with it); weights
claims are owned only when `storage.retain` is false, so by default the
weights survive deletion of the model.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from localmodel import API_VERSION, KIND, __version__
from localmodel.api import GGUF, EngineName, LocalModel
from localmodel.contract import (
    ANNOTATION_NODE,
    ANNOTATION_POD_SPEC_HASH,
    ANNOTATION_THREADS,
    APP_NAME,
    CONTAINER_DOWNLOAD,
    CONTAINER_GATEWAY,
    CONTAINER_PULL,
    LABEL_APP_NAME,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    MANAGED_BY,
    PORT_ENGINE,
    PORT_HTTP,
    VOLUME_MODELFILE,
    VOLUME_WEIGHTS,
)
from localmodel.engines import llama_server, ollama
from localmodel.facts.quantity import format_bytes
from localmodel.gateway_contract import (
    GATEWAY_PORT,
    HEALTH_PATH,
    OVERFLOW_API_KEY_ENV,
    READY_PATH,
    gateway_variables,
)
from localmodel.rules import Tuning, spec_key

Manifest = dict[str, Any]

DEFAULT_OPERATOR_IMAGE = f"ghcr.io/localmodel/localmodel-operator:{__version__}"
# The operator image (Dockerfile: python:3.11-slim, Debian) has a POSIX shell,
# coreutils' sha256sum and python3: what the Ollama download step runs on.
OPERATOR_SHELL = "/bin/sh"
SERVICE_PORT = ollama.PORT  # callers keep Ollama's port; the Service targets the gateway
GATEWAY_CPU_MILLI = 250
GATEWAY_MEMORY_BYTES = 256 * 1024**2
MODELFILE_DIR = "/etc/localmodel"
# Under the weights volume: where Ollama's download step keeps its part file
# and checksum record.
OLLAMA_DOWNLOAD_DIR = "download"


@dataclass(frozen=True)
class RenderOptions:
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class ReplicaPlan:
    """One placed replica with its tuning: the renderer's input per pod."""

    replica: int
    node: str
    tuning: Tuning
    reason: str = ""
    # The weights claim this replica mounts; empty: the default name. The
    # operator picks another when the default claim is bound to a volume the
    # replica's new node cannot reach.
    claim: str = ""


def replica_claim(lm: LocalModel, r: ReplicaPlan) -> str:
    return r.claim or claim_name(lm, r.replica)


def pod_name(lm: LocalModel, replica: int) -> str:
    return f"{lm.metadata.name}-{replica}"


def claim_name(lm: LocalModel, replica: int) -> str:
    return f"{lm.metadata.name}-weights-{replica}"


def configmap_name(lm: LocalModel) -> str:
    return f"{lm.metadata.name}-modelfile"


def endpoint(lm: LocalModel) -> str:
    return f"http://{lm.metadata.name}.{lm.metadata.namespace}.svc:{SERVICE_PORT}"


def labels(lm: LocalModel) -> dict[str, str]:
    return {
        LABEL_APP_NAME: APP_NAME,
        LABEL_INSTANCE: lm.metadata.name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_NAME: lm.metadata.name,
    }


def owner_reference(lm: LocalModel) -> list[dict[str, Any]]:
    # Offline renders have no uid; an owner reference without one is invalid.
    if not lm.metadata.uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": lm.metadata.name,
            "uid": lm.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


class _Meta:
    """One model's metadata, worked out once for all of its objects: its
    labels and owner reference are the same objects in each (manifests are
    never changed in place)."""

    __slots__ = ("labels", "namespace", "refs")

    def __init__(self, lm: LocalModel) -> None:
        self.namespace = lm.metadata.namespace
        self.labels = labels(lm)
        self.refs = owner_reference(lm)

    def __call__(
        self,
        name: str,
        *,
        owned: bool = True,
        replica: int | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": (
                self.labels if replica is None else {**self.labels, LABEL_REPLICA: str(replica)}
            ),
        }
        if annotations is not None:
            meta["annotations"] = annotations
        if owned and self.refs:
            meta["ownerReferences"] = self.refs
        return meta


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


def configmap_data(lm: LocalModel, replicas: Sequence[ReplicaPlan]) -> dict[str, str]:
    """Each replica's Modelfile, by the key its pod mounts."""
    return {f"replica-{r.replica}.Modelfile": modelfile(lm, r.tuning) for r in replicas}


def render_configmap(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    meta: _Meta | None = None,
    data: Any = None,
) -> Manifest:
    """``data``: `configmap_data`, when the caller has it (or a text template's mark)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": (meta or _Meta(lm))(configmap_name(lm)),
        "data": configmap_data(lm, replicas) if data is None else data,
    }


def claim_owned(lm: LocalModel) -> bool:
    """Whether the model's weights claims carry its owner reference (are
    collected with it): not when `storage.retain`, nor offline (no uid)."""
    return not lm.spec.storage.retain and bool(owner_reference(lm))


def render_claim(lm: LocalModel, r: ReplicaPlan, meta: _Meta | None = None) -> Manifest:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": format_bytes(r.tuning.storage_bytes)}},
    }
    if lm.spec.storage.storage_class_name:
        spec["storageClassName"] = lm.spec.storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": (meta or _Meta(lm))(
            replica_claim(lm, r), owned=claim_owned(lm), replica=r.replica
        ),
        "spec": spec,
    }


def render_service(lm: LocalModel, meta: _Meta | None = None) -> Manifest:
    target = PORT_HTTP if lm.spec.gateway.enabled else PORT_ENGINE
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": (meta or _Meta(lm))(lm.metadata.name),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_NAME: lm.metadata.name},
            "ports": [
                {"name": PORT_HTTP, "port": SERVICE_PORT, "targetPort": target, "protocol": "TCP"}
            ],
        },
    }


def _resources(cpu: str, memory: str) -> dict[str, Any]:
    both = {"cpu": cpu, "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def _env(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


# Starts `ollama serve` for the init step and stops it on every way out: a
# failed pull or create (set -e), a signal, or the end of the script.
_SERVE = """\
ollama serve >/tmp/ollama.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
trap 'exit 143' HUP INT TERM
tries=0
until ollama list >/dev/null 2>&1; do
  tries=$((tries+1))
  if [ "$tries" -gt 120 ]; then cat /tmp/ollama.log; exit 1; fi
  sleep 1
done
"""


def init_script(lm: LocalModel, tuning: Tuning) -> str:
    """Pull only when the weights are not on the volume, then build the tuned model.

    With `gguf` there is no pull at all: the download step has put the file
    into Ollama's store, and the Modelfile's FROM names it there.
    """
    model = shlex.quote(lm.spec.model)
    remove = "".join(f"rm -f {shlex.quote(p)}\n" for p in tuning.remove_libraries)
    if lm.spec.gguf is not None:
        weights = (
            f"echo 'localmodel: creating '{model}' from '"
            f"{shlex.quote(lm.spec.gguf.file_name())}' on the volume: no registry pull'\n"
        )
    else:
        weights = (
            f"if ollama show {model} >/dev/null 2>&1; then\n"
            f"  echo 'localmodel: weights for '{model}' already on the volume: no pull'\n"
            "else\n"
            f"  ollama pull {model}\n"
            "fi\n"
        )
    return (
        "set -eu\n"
        f"{remove}"
        f"{_SERVE}"
        f"{weights}"
        f"ollama create {model} -f {MODELFILE_DIR}/Modelfile\n"
    )


def _engine_command(tuning: Tuning) -> dict[str, Any]:
    if not tuning.remove_libraries:
        return {"args": [ollama.SERVE]}
    removal = " ".join(shlex.quote(p) for p in tuning.remove_libraries)
    start = f"rm -f {removal}; exec {ollama.BINARY} {ollama.SERVE}"
    return {"command": [ollama.SHELL, "-c", start]}


def pod_selector(lm: LocalModel) -> str:
    """The label selector of a LocalModel's pods, as the scale subresource reports it."""
    return f"{LABEL_NAME}={lm.metadata.name}"


# The download step, as a template: $-names are the shell's, {braces} are
# filled in (quoted) by gguf_init_script. {fetch} downloads $url to "$part"
# and fails on an HTTP error.
_GGUF_INIT = """\
set -eu
file={file}
part={part}
mark={mark}
url={url}
want={sha256}
mkdir -p "$(dirname "$file")" "$(dirname "$part")" "$(dirname "$mark")"
if [ -f "$file" ] && [ "$(cat "$mark" 2>/dev/null)" = "$want" ]; then
  echo "localmodel: $file already on the volume (sha256 recorded): no download"
  exit 0
fi
if [ -f "$file" ]; then
  got="$(sha256sum "$file" | cut -d ' ' -f 1)"
  if [ "$got" = "$want" ]; then
    echo "$want" > "$mark"
    echo "localmodel: $file already on the volume (sha256 checked): no download"
    exit 0
  fi
  echo "localmodel: $file on the volume has sha256 $got, not $want: downloading it again"
fi
rm -f "$part"
{fetch}
got="$(sha256sum "$part" | cut -d ' ' -f 1)"
if [ "$got" != "$want" ]; then
  echo "localmodel: the download from $url has sha256 $got, not $want" >&2
  rm -f "$part"
  exit 1
fi
mv -f "$part" "$file"
echo "$want" > "$mark"
echo "localmodel: downloaded $file"
"""

# llama-server's image has curl (its base stage installs it).
CURL_FETCH = 'curl -fsSL --retry 5 --retry-delay 2 -o "$part" "$url"'

# Ollama's image has neither curl nor wget (an Ubuntu base with
# ca-certificates), so its download step runs in the operator image, with
# Python's standard library.
# Transient failures (no connection, 5xx, 408, 429) are retried, like curl's
# --retry; any other HTTP error fails at once.
_PYTHON_DOWNLOAD = """\
import shutil, sys, time, urllib.error, urllib.request
url, part = sys.argv[1:3]
for attempt in range(1, 6):
    try:
        with urllib.request.urlopen(url, timeout=60) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        break
    except urllib.error.HTTPError as e:
        if attempt == 5 or (e.code < 500 and e.code not in (408, 429)):
            sys.exit(f"localmodel: cannot download {url}: {e}")
    except OSError as e:
        if attempt == 5:
            sys.exit(f"localmodel: cannot download {url}: {e}")
    time.sleep(2)
"""
assert "'" not in _PYTHON_DOWNLOAD  # it goes into the shell script in single quotes
PYTHON_FETCH = f"python3 -I -c '{_PYTHON_DOWNLOAD}' \"$url\" \"$part\""


def gguf_init_script(gguf: GGUF, directory: str = llama_server.MODELS_DIR) -> str:
    """llama-server's download step: the GGUF file once into `directory`.

    Nothing to do when the volume holds it with a matching checksum; a
    download is checked before it replaces anything. `<file>.sha256` records a
    verified checksum, so a restart does not hash gigabytes again; a file put
    on the volume by other means is hashed once. The download lands in
    `<file>.part` and is renamed only once its checksum matches, so a failed or
    wrong download never removes a good file.
    """
    path = f"{directory}/{gguf.file_name()}"
    return _gguf_script(gguf, path, f"{path}.part", f"{path}.sha256", CURL_FETCH)


def ollama_gguf_blob(gguf: GGUF, models: str = ollama.MODELS_DIR) -> str:
    """Where Ollama's store keeps the file: `blobs/sha256-<hex>`, named by its
    checksum (docs/engine-facts.md#weights-imported-from-a-gguf-file)."""
    return f"{models}/blobs/sha256-{gguf.sha256}"


def ollama_gguf_script(gguf: GGUF, home: str = ollama.HOME) -> str:
    """Ollama's download step: the same checks as llama-server's, but the file
    lands as the blob Ollama's store would make of it, so `ollama create`
    FROM it finds the blob there and copies nothing: the weights are on the
    volume once. The part file and the checksum record stay outside the
    store (Ollama's prune removes files there that are not blobs)."""
    stage = f"{home}/{OLLAMA_DOWNLOAD_DIR}/{gguf.file_name()}"
    blob = ollama_gguf_blob(gguf, f"{home}/models")
    return _gguf_script(gguf, blob, f"{stage}.part", f"{stage}.sha256", PYTHON_FETCH)


def _gguf_script(gguf: GGUF, file: str, part: str, mark: str, fetch: str) -> str:
    q = shlex.quote
    return _GGUF_INIT.format(
        file=q(file), part=q(part), mark=q(mark), url=q(gguf.url), sha256=gguf.sha256, fetch=fetch
    )


def _engine_port(lm: LocalModel) -> int:
    return llama_server.PORT if lm.spec.engine.name is EngineName.LLAMA_SERVER else ollama.PORT


def gateway_env(lm: LocalModel, tuning: Tuning) -> dict[str, str]:
    """Flags for `localmodel gateway`, as its LOCALMODEL_GATEWAY_* variables
    (named by localmodel.gateway_contract; the overflow's API key is not among
    them: see `gateway_secret_env`)."""
    gw, spec = lm.spec.gateway, lm.spec
    flags: dict[str, str] = {}
    if gw.overflow is not None:
        flags = {
            "overflow-url": gw.overflow.url,
            "overflow-model": gw.overflow.model,
            "overflow-after": f"{gw.overflow.after:g}",
        }
    return gateway_variables(flags | {
        "upstream": f"http://127.0.0.1:{_engine_port(lm)}",
        "engine": spec.engine.name.value,
        "listen": f"0.0.0.0:{GATEWAY_PORT}",
        "model": spec.model,
        "slots": str(spec.slots),
        "threads": str(tuning.threads),
        "context": str(spec.context),
        "max-queue": str(gw.max_queue),
        "deadline": str(gw.deadline_seconds),
        "max-tokens": str(gw.max_tokens),
        "keep-alive": spec.keep_alive,
    })


def gateway_secret_env(lm: LocalModel) -> list[Manifest]:
    """The overflow's API key, mapped from its Secret: the key itself never
    passes through the operator, the pod spec or its hash."""
    overflow = lm.spec.gateway.overflow
    if overflow is None or overflow.api_key_secret_ref is None:
        return []
    ref = overflow.api_key_secret_ref
    return [
        {
            "name": OVERFLOW_API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    ]


def _engine_resources(t: Tuning) -> dict[str, Any]:
    return _resources(str(t.cpu), format_bytes(t.memory_bytes))


def _engine_mounts() -> list[dict[str, Any]]:
    return [
        {"name": VOLUME_WEIGHTS, "mountPath": ollama.HOME},
        {"name": VOLUME_MODELFILE, "mountPath": MODELFILE_DIR, "readOnly": True},
    ]


def build_engine_container(lm: LocalModel, r: ReplicaPlan, options: RenderOptions) -> Manifest:
    """The Ollama server: the tuned environment, whole CPUs, the weights volume.

    Without the gateway it is what the Service targets, so it has the readiness
    probe; with it the gateway's probe speaks for the pod.
    """
    t = r.tuning
    engine: Manifest = {
        "name": ollama.NAME,  # the engine container is named after its engine
        "image": lm.spec.engine.resolved_image(),
        "imagePullPolicy": options.pull_policy,
        **_engine_command(t),
        "env": _env(dict(t.env) | {e.name: e.value for e in lm.spec.env}),
        "ports": [{"name": PORT_ENGINE, "containerPort": ollama.PORT, "protocol": "TCP"}],
        "resources": _engine_resources(t),
        "volumeMounts": _engine_mounts(),
    }
    if not lm.spec.gateway.enabled:
        engine["readinessProbe"] = {
            "httpGet": {"path": ollama.HEALTH_PATH, "port": PORT_ENGINE},
            "periodSeconds": 5,
        }
    return engine


def _llama_probe(loopback: bool, **extra: int) -> Manifest:
    """llama-server's /health as a probe. The kubelet dials the pod's IP, so an
    engine bound to loopback (behind the gateway) is asked from inside its
    container with the image's curl (llama.cpp's server image has it for its
    own HEALTHCHECK); an engine on all addresses gets a plain httpGet."""
    if loopback:
        url = f"http://127.0.0.1:{llama_server.PORT}{llama_server.HEALTH_PATH}"
        return {"exec": {"command": ["curl", "-fsS", "-o", "/dev/null", "--max-time", "4", url]},
                **extra}
    return {"httpGet": {"path": llama_server.HEALTH_PATH, "port": PORT_ENGINE}, **extra}


def build_llama_server_container(
    lm: LocalModel, r: ReplicaPlan, options: RenderOptions
) -> Manifest:
    """llama-server: the rules' flags, whole CPUs, the GGUF on the weights volume.

    /health answers 503 while the model loads: the startup probe gives a large
    model time to load before liveness counts; without the gateway /health is
    also the readiness probe.
    """
    t = r.tuning
    loopback = lm.spec.gateway.enabled  # the rules bind it to 127.0.0.1 behind the gateway
    engine: Manifest = {
        "name": llama_server.NAME,
        "image": lm.spec.engine.resolved_image(),
        "imagePullPolicy": options.pull_policy,
        "args": list(t.args),
        "env": _env(dict(t.env) | {e.name: e.value for e in lm.spec.env}),
        "ports": [{"name": PORT_ENGINE, "containerPort": llama_server.PORT, "protocol": "TCP"}],
        "resources": _engine_resources(t),
        "volumeMounts": [{"name": VOLUME_WEIGHTS, "mountPath": llama_server.MODELS_DIR}],
        "startupProbe": _llama_probe(loopback, periodSeconds=5, timeoutSeconds=5,
                                     failureThreshold=360),
        "livenessProbe": _llama_probe(loopback, periodSeconds=10, timeoutSeconds=5,
                                      failureThreshold=6),
    }
    if not loopback:
        engine["readinessProbe"] = _llama_probe(loopback, periodSeconds=5, timeoutSeconds=5)
    return engine


def build_llama_server_init_container(
    lm: LocalModel, r: ReplicaPlan, options: RenderOptions
) -> Manifest:
    """Downloads the GGUF file when the volume lacks it (`gguf_init_script`)."""
    assert lm.spec.gguf is not None  # the API requires it for llama-server
    return {
        "name": CONTAINER_DOWNLOAD,
        "image": lm.spec.engine.resolved_image(),
        "imagePullPolicy": options.pull_policy,
        "command": [llama_server.SHELL, "-c", gguf_init_script(lm.spec.gguf)],
        "resources": _engine_resources(r.tuning),
        "volumeMounts": [{"name": VOLUME_WEIGHTS, "mountPath": llama_server.MODELS_DIR}],
    }


def build_gateway_container(lm: LocalModel, r: ReplicaPlan, options: RenderOptions) -> Manifest:
    """The slot gate sidecar (`localmodel gateway`), configured by environment."""
    return {
        "name": CONTAINER_GATEWAY,
        "image": lm.spec.gateway.image or options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": ["localmodel", "gateway"],
        "env": [*_env(gateway_env(lm, r.tuning)), *gateway_secret_env(lm)],
        "ports": [{"name": PORT_HTTP, "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": PORT_HTTP},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": PORT_HTTP},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": _resources(f"{GATEWAY_CPU_MILLI}m", format_bytes(GATEWAY_MEMORY_BYTES)),
    }


def build_init_container(lm: LocalModel, r: ReplicaPlan, options: RenderOptions) -> Manifest:
    """Pulls the weights when the volume lacks them and builds the tuned model
    (`init_script`), with the engine's image, resources and mounts."""
    t = r.tuning
    return {
        "name": CONTAINER_PULL,
        "image": lm.spec.engine.resolved_image(),
        "imagePullPolicy": options.pull_policy,
        "command": [ollama.SHELL, "-c", init_script(lm, t)],
        "env": _env(
            {k: v for k, v in t.env.items() if k in ("OLLAMA_MODELS", "GOMAXPROCS")}
            | {"OLLAMA_HOST": f"127.0.0.1:{ollama.PORT}"}
            # The downloaded blob is not in any manifest until `ollama create`
            # ran: the init step's server must not prune it at start.
            | ({ollama.NOPRUNE: "1"} if lm.spec.gguf is not None else {})
        ),
        "resources": _engine_resources(t),
        "volumeMounts": _engine_mounts(),
    }


def build_ollama_download_container(
    lm: LocalModel, r: ReplicaPlan, options: RenderOptions
) -> Manifest:
    """Downloads `gguf` into Ollama's store when the volume lacks it
    (`ollama_gguf_script`). Ollama's image has no downloader, so this step runs
    in the operator image; as root, like Ollama's own containers, since the
    volume's files are Ollama's (root's), with no capabilities."""
    assert lm.spec.gguf is not None
    return {
        "name": "download",
        "image": options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": [OPERATOR_SHELL, "-c", ollama_gguf_script(lm.spec.gguf)],
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": _engine_resources(r.tuning),
        "volumeMounts": [{"name": "weights", "mountPath": ollama.HOME}],
    }


def build_containers(
    lm: LocalModel, r: ReplicaPlan, options: RenderOptions
) -> tuple[list[Manifest], list[Manifest]]:
    """A pod's init containers and containers. They read the spec (never its
    replicas, cpu or placement: see `PodParts`), the replica's tuning and the
    options, nothing of the model's name or the replica's node."""
    if lm.spec.engine.name is EngineName.LLAMA_SERVER:
        engine = build_llama_server_container(lm, r, options)
        inits = [build_llama_server_init_container(lm, r, options)]
    else:
        engine = build_engine_container(lm, r, options)
        inits = [build_init_container(lm, r, options)]
        if lm.spec.gguf is not None:
            inits.insert(0, build_ollama_download_container(lm, r, options))
    containers = [engine]
    if lm.spec.gateway.enabled:
        containers.append(build_gateway_container(lm, r, options))
    return inits, containers


@dataclass(frozen=True)
class _Containers:
    tuning: Tuning  # held: its id is part of the key
    inits: list[Manifest]
    containers: list[Manifest]
    json: dict[str, str]  # field -> its JSON text, for the pod spec's hash


class PodParts:
    """What pods of alike models share, by value, for one pass: a pod's
    containers are a function of its spec as the rules read it
    (`rules.spec_key`: all but replicas, cpu and placement), its tuning and
    the options, so every pod with the same three gets the same container
    objects (manifests are never changed in place) and their JSON text, which
    `pod_spec_hash` reuses. Keep one per pass: the tuning is keyed by identity."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Hashable, int, RenderOptions], _Containers] = {}

    def containers(
        self, lm: LocalModel, r: ReplicaPlan, options: RenderOptions, key: Hashable = None
    ) -> _Containers:
        """``key``: the spec's `rules.spec_key`, when the caller has it."""
        memo = (spec_key(lm.spec) if key is None else key, id(r.tuning), options)
        found = self._seen.get(memo)
        if found is None or found.tuning is not r.tuning:
            inits, containers = build_containers(lm, r, options)
            found = self._seen[memo] = _Containers(
                r.tuning,
                inits,
                containers,
                {
                    "initContainers": json.dumps(inits, sort_keys=True),
                    "containers": json.dumps(containers, sort_keys=True),
                },
            )
        return found


def _node_affinity(node: str) -> Manifest:
    """A pod's affinity: bound to its planned node."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }


def _volume_names(lm: LocalModel, r: ReplicaPlan) -> tuple[str, str, str]:
    """What a pod's volumes name: its weights claim, its ConfigMap, and the
    key of its replica's Modelfile there."""
    return replica_claim(lm, r), configmap_name(lm), f"replica-{r.replica}.Modelfile"


def _volumes(claim: str, configmap: str, key: str, *, llama: bool) -> list[Manifest]:
    """A pod's volumes: the weights claim, and (Ollama) its Modelfile."""
    volumes: list[Manifest] = [
        {"name": VOLUME_WEIGHTS, "persistentVolumeClaim": {"claimName": claim}}
    ]
    if not llama:
        volumes.append(
            {
                "name": VOLUME_MODELFILE,
                "configMap": {
                    "name": configmap,
                    "items": [{"key": key, "path": "Modelfile"}],
                },
            }
        )
    return volumes


def build_pod_spec(
    lm: LocalModel,
    r: ReplicaPlan,
    options: RenderOptions,
    parts: _Containers | None = None,
) -> Manifest:
    """The pod spec: bound to the planned node, the containers, the volumes."""
    llama = lm.spec.engine.name is EngineName.LLAMA_SERVER
    if parts is None:
        inits, containers = build_containers(lm, r, options)
    else:
        inits, containers = parts.inits, parts.containers
    return {
        "affinity": _node_affinity(r.node),
        "initContainers": inits,
        "containers": containers,
        "volumes": _volumes(*_volume_names(lm, r), llama=llama),
        **_pod_spec_rest(lm),
    }


def _pod_spec_rest(lm: LocalModel) -> Manifest:
    """A pod spec's fields besides its affinity, containers and volumes (the
    ones `pod_digest` has as text): they read the spec alone."""
    rest: Manifest = {"enableServiceLinks": False}
    if lm.spec.placement.node_selector:
        rest["nodeSelector"] = dict(lm.spec.placement.node_selector)
    if lm.spec.placement.tolerations:
        rest["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True, mode="json")
            for t in lm.spec.placement.tolerations
        ]
    return rest


def pod_digest(lm: LocalModel, r: ReplicaPlan, parts: _Containers) -> str:
    """`manifest_hash(build_pod_spec(...))` without the spec: its containers'
    JSON text from ``parts``, its affinity's and volumes' put together around
    their names (what the operator compares with a pod's
    `ANNOTATION_POD_SPEC_HASH`; the manifest is made only for a pod to create)."""
    known = {**parts.json, "affinity": affinity_text(r.node), "volumes": volumes_text(lm, r)}
    return pod_spec_hash(_pod_spec_rest(lm), known)


def manifest_hash(obj: Mapping[str, Any]) -> str:
    """The digest the operator records on what it writes and compares to see
    whether an object is stale: of a pod's spec (`ANNOTATION_POD_SPEC_HASH`),
    of an applied ConfigMap or Service (`ANNOTATION_APPLIED_HASH`)."""
    return hashlib.sha256(_SORTED_JSON.encode(obj).encode()).hexdigest()[:16]


def pod_spec_hash(spec: Mapping[str, Any], known: Mapping[str, str]) -> str:
    """`manifest_hash(spec)`, with the JSON text of some top-level fields known
    already (``known``: field -> its `json.dumps(..., sort_keys=True)`): the same
    text, put together as the encoder writes an object (keys sorted, ", " and
    ": " between), so the same digest. The rest is encoded field by field with
    one kept encoder (`json.dumps` with an argument makes a new one per call)."""
    text = ", ".join(
        f"{_key_text(k)}: {known[k] if k in known else _value_text(spec[k])}"
        for k in sorted(spec.keys() | known.keys())
    )
    return hashlib.sha256(f"{{{text}}}".encode()).hexdigest()[:16]


def _key_text(key: str) -> str:
    """A key's JSON text; a pod spec's own keys are encoded once."""
    found = _KEY_TEXT.get(key)
    if found is None:  # (a pod spec has a handful of field names)
        found = _KEY_TEXT[key] = _SORTED_JSON.encode(key)
    return found


def _value_text(value: Any) -> str:
    """A value's JSON text (booleans without the encoder's general path)."""
    if value is True or value is False:
        return "true" if value else "false"
    return _SORTED_JSON.encode(value)


# What `json.dumps(obj, sort_keys=True)` encodes with (the same arguments).
_SORTED_JSON = json.JSONEncoder(sort_keys=True)
_KEY_TEXT: dict[str, str] = {}  # a key's JSON text, once encoded


class _TextTemplate:
    """The sorted JSON text of an object some of whose strings vary, put
    together around them: `fill(*values)` is `json.dumps(make(*values),
    sort_keys=True)` without encoding the rest again. ``make`` builds the
    object from ``arity`` strings; each may stand anywhere in a string, any
    number of times, or nowhere (a string's JSON text is its characters',
    each escaped alone). A value whose index is in ``raw`` stands, whole,
    for an object: it is given as that object's JSON text."""

    def __init__(self, make: Callable[..., Any], arity: int, raw: Sequence[int] = ()) -> None:
        marks = [_mark(i) for i in range(arity)]
        text = _SORTED_JSON.encode(make(*marks))
        self._slots: list[tuple[int, bool]] = []  # (value, raw) in the order they appear
        self._pieces: list[str] = []
        at = 0
        for found in _MARK.finditer(text):
            i, start, end = int(found.group(1)), found.start(), found.end()
            if i in raw:  # the whole string, quotes and all
                assert text[start - 1] == text[end] == '"', text
                start, end = start - 1, end + 1
            self._pieces.append(text[at:start])
            self._slots.append((i, i in raw))
            at = end
        self._pieces.append(text[at:])

    def fill(self, *values: str) -> str:
        encode, pieces = _SORTED_JSON.encode, self._pieces
        out = [pieces[0]]
        for k, (i, raw) in enumerate(self._slots):
            out.append(values[i] if raw else encode(values[i])[1:-1])
            out.append(pieces[k + 1])
        return "".join(out)


def _mark(i: int) -> str:
    """The string that stands for a template's value ``i`` (no name holds a NUL)."""
    return f"\x00{i}\x00"


_MARK = re.compile(r"\\u0000(\d+)\\u0000")  # `_mark`'s characters, escaped


_AFFINITY = _TextTemplate(_node_affinity, 1)
_VOLUMES = {
    llama: _TextTemplate(lambda c, m, k, llama=llama: _volumes(c, m, k, llama=llama), 3)
    for llama in (False, True)
}


def affinity_text(node: str) -> str:
    """`json.dumps(_node_affinity(node), sort_keys=True)`, put together."""
    return _AFFINITY.fill(node)


def volumes_text(lm: LocalModel, r: ReplicaPlan) -> str:
    """The JSON text of a pod's volumes (`json.dumps(..., sort_keys=True)`), put together."""
    llama = lm.spec.engine.name is EngineName.LLAMA_SERVER
    return _VOLUMES[llama].fill(*_volume_names(lm, r))


def render_pod(
    lm: LocalModel,
    r: ReplicaPlan,
    options: RenderOptions,
    parts: _Containers | None = None,
    meta: _Meta | None = None,
) -> Manifest:
    spec = build_pod_spec(lm, r, options, parts)
    digest = manifest_hash(spec) if parts is None else pod_digest(lm, r, parts)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": (meta or _Meta(lm))(
            pod_name(lm, r.replica),
            replica=r.replica,
            annotations={
                ANNOTATION_NODE: r.node,
                ANNOTATION_THREADS: str(r.tuning.threads),
                ANNOTATION_POD_SPEC_HASH: digest,
            },
        ),
        "spec": spec,
    }


def applied_objects(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], meta: _Meta | None = None, data: Any = None
) -> list[Manifest]:
    """The objects the operator server-side applies and keeps equal to the spec
    by their hash: the ConfigMap of Ollama's Modelfiles (once a replica is
    placed), then the Service. ``data``: the ConfigMap's (`render_configmap`)."""
    meta = meta or _Meta(lm)
    replicas = sorted(replicas, key=lambda r: r.replica)
    configmap = (
        [render_configmap(lm, replicas, meta, data)]
        if replicas and lm.spec.engine.name is EngineName.OLLAMA
        else []
    )
    return [*configmap, render_service(lm, meta)]


def applied_hashes(lm: LocalModel, replicas: Sequence[ReplicaPlan]) -> dict[tuple[str, str], str]:
    """(kind, name) -> `manifest_hash` of each of `applied_objects`: what a
    stored object's applied-hash annotation is compared with."""
    return {
        (m["kind"], m["metadata"]["name"]): manifest_hash(m) for m in applied_objects(lm, replicas)
    }


class AppliedDigests:
    """`applied_hashes` for one pass: alike models share a text template of
    each applied object (`_TextTemplate`), so a model's digests cost encoding
    its own strings, not its objects. Of a model, these objects read its
    spec (the key: `rules.spec_key`, all of it they read), its name,
    namespace and uid (the template's values, with the ConfigMap's data),
    whether it has a uid (offline renders have none) and whether a replica
    is placed (`test_pass_memo` holds the premise).
    Each template is checked against the plain digests of the model it is
    made from; one that differs is not used (the plain way, for every model
    of its key). Keep one per pass."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, list[_Applied] | None] = {}

    def __call__(
        self, lm: LocalModel, replicas: Sequence[ReplicaPlan], key: Hashable = None
    ) -> dict[tuple[str, str], str]:
        """``key``: the spec's `rules.spec_key`, when the caller has it."""
        memo = (spec_key(lm.spec) if key is None else key, bool(lm.metadata.uid), bool(replicas))
        if memo not in self._seen:
            made, plain = _applied_templates(lm, replicas), applied_hashes(lm, replicas)
            self._seen[memo] = made if _fill(lm, replicas, made) == plain else None
            return plain
        templates = self._seen[memo]
        return applied_hashes(lm, replicas) if templates is None else _fill(lm, replicas, templates)


class _Applied(NamedTuple):
    kind: str
    name: str  # with the marks of the model's name, namespace and uid
    text: _TextTemplate


_APPLIED_MARKS = tuple(_mark(i) for i in range(4))  # name, namespace, uid, data


def _applied_templates(lm: LocalModel, replicas: Sequence[ReplicaPlan]) -> list[_Applied]:
    """Text templates of `lm`'s applied objects, around its name, namespace,
    uid and the ConfigMap's data (its JSON text, `raw`)."""

    def marked(name: str, namespace: str, uid: str) -> LocalModel:
        meta = lm.metadata.model_copy(
            update={"name": name, "namespace": namespace, "uid": uid if lm.metadata.uid else ""}
        )
        return lm.model_copy(update={"metadata": meta})

    def make(i: int) -> Callable[..., Manifest]:
        def made(name: str, namespace: str, uid: str, data: str) -> Manifest:
            return applied_objects(marked(name, namespace, uid), replicas, data=data)[i]

        return made

    shapes = applied_objects(marked(*_APPLIED_MARKS[:3]), replicas, data={})
    return [
        _Applied(m["kind"], m["metadata"]["name"], _TextTemplate(make(i), 4, raw=(3,)))
        for i, m in enumerate(shapes)
    ]


def _named(marked: str, values: Sequence[str]) -> str:
    for mark, value in zip(_APPLIED_MARKS[:3], values[:3], strict=True):
        marked = marked.replace(mark, value)
    return marked


def _fill(
    lm: LocalModel, replicas: Sequence[ReplicaPlan], templates: Sequence[_Applied]
) -> dict[tuple[str, str], str]:
    meta = lm.metadata
    data = configmap_data(lm, sorted(replicas, key=lambda r: r.replica))
    values = (meta.name, meta.namespace, meta.uid or "", _SORTED_JSON.encode(data))
    return {
        (t.kind, _named(t.name, values)): hashlib.sha256(
            t.text.fill(*values).encode()
        ).hexdigest()[:16]
        for t in templates
    }


def render_objects(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    options: RenderOptions | None = None,
    parts: PodParts | None = None,
    key: Hashable = None,
) -> list[Manifest]:
    """Every object for one LocalModel: ConfigMap (Ollama's Modelfiles), claims,
    pods, Service. ``parts``: a pass's `PodParts` (``key``: the spec's
    `rules.spec_key`, when the caller has it)."""
    options = options or RenderOptions()
    replicas = sorted(replicas, key=lambda r: r.replica)
    meta = _Meta(lm)
    *configmap, service = applied_objects(lm, replicas, meta)
    return [
        *configmap,
        *(render_claim(lm, r, meta) for r in replicas),
        *(
            render_pod(
                lm, r, options, None if parts is None else parts.containers(lm, r, options, key),
                meta,
            )
            for r in replicas
        ),
        service,
    ]
