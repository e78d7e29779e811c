"""The slot gate sidecar (`localmodel gateway`) in a model's pod, configured
by environment."""

from __future__ import annotations

from localmodel.api import LocalModel
from localmodel.contract import CONTAINER_GATEWAY, PORT_ADMIN, PORT_HTTP, VOLUME_KEYS
from localmodel.engines.registry import engine
from localmodel.facts.quantity import format_bytes
from localmodel.gateway_contract import (
    ADMIN_PORT,
    GATEWAY_PORT,
    HEALTH_PATH,
    OVERFLOW_API_KEY_ENV,
    READY_PATH,
    env_name,
    gateway_variables,
)
from localmodel.podspec import (
    NONROOT_UID,
    Manifest,
    container_security,
    env_list,
    probe_periods,
    resources,
)
from localmodel.render.names import gateway_cpu_milli, gateway_memory_bytes
from localmodel.render.plan import RenderOptions, ReplicaPlan
from localmodel.rules.model import Tuning


def gateway_env(lm: LocalModel, tuning: Tuning, router_key: str = "") -> dict[str, str]:
    """Flags for `localmodel gateway`, as its LOCALMODEL_GATEWAY_* variables
    (named by localmodel.gateway_contract; the overflow's API key is not among
    them: see `gateway_secret_env`; nor the pod's identity: `router_env`)."""
    gw, spec = lm.spec.gateway, lm.spec
    flags: dict[str, str] = {"router-key": router_key} if router_key else {}
    if gw.overflow is not None:
        flags = {
            "overflow-url": gw.overflow.url,
            "overflow-model": gw.overflow.model,
            "overflow-after": f"{gw.overflow.after:g}",
        }
        if gw.overflow.budget is not None:
            budget = gw.overflow.budget
            flags["overflow-budget"] = f"{budget.requests}/{budget.window_seconds}"
    if gw.auth is not None:
        flags["keys-file"] = KEYS_FILE
    return gateway_variables(
        flags
        | {
            "upstream": f"http://127.0.0.1:{engine(spec.engine.name).pod.port}",
            "engine": spec.engine.name.value,
            "listen": f"0.0.0.0:{GATEWAY_PORT}",
            "admin-listen": f"0.0.0.0:{ADMIN_PORT}",
            "model": spec.model,
            "slots": str(spec.slots),
            "threads": str(tuning.threads),
            "context": str(spec.context),
            "max-queue": str(gw.max_queue),
            "deadline": str(gw.deadline_seconds),
            "max-tokens": str(gw.max_tokens),
            "keep-alive": spec.keep_alive,
        }
    )


def router_env(router_key: str) -> list[Manifest]:
    """With the router on (its public key known): the pod's namespace and
    name, from the downward API, which the router's marks must name
    (gateway_contract/marks.py). Without it, nothing: pods render as before."""
    if not router_key:
        return []
    return [{"name": env_name(flag), "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for flag, path in (("pod-namespace", "metadata.namespace"),
                               ("pod-name", "metadata.name"))]


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


KEYS_DIR = "/etc/localmodel/keys"  # the keys Secret, mounted whole: kubelet updates it in place
KEYS_FILE = f"{KEYS_DIR}/keys.json"
# The keys file's mode: readable by every user, because what keeps it from
# the rest of the pod is the mount, not the mode: only the gateway container
# mounts it, and the gateway's one user (NONROOT_UID) is not the file's owner
# (root) nor, without an fsGroup, in its group (root's). 0440 left the gateway
# of an Ollama pod unable to read it (Permission denied, exit 2). An fsGroup
# on Ollama's pods was the other way, and a worse one: the kubelet would
# re-group the weights volume (root's store; its files' change time, which the
# checksum record is bound to) and add the gateway's group to root's
# containers. In llama-server's pods every container is NONROOT_UID anyway.
# The file holds each key's SHA-256, not the key (docs/security.md).
KEYS_MODE = 0o444


def gateway_volumes(lm: LocalModel) -> list[Manifest]:
    """The API keys' Secret (spec.gateway.auth), its one key as keys.json. A
    whole-volume mount, not subPath: kubelet then swaps in a changed Secret
    and the gateway reloads it."""
    auth = lm.spec.gateway.auth
    if auth is None or not lm.spec.gateway.enabled:
        return []
    ref = auth.keys_secret_ref
    return [
        {
            "name": VOLUME_KEYS,
            "secret": {
                "secretName": ref.name,
                "items": [{"key": ref.key, "path": KEYS_FILE.rsplit("/", 1)[1]}],
                "defaultMode": KEYS_MODE,
            },
        }
    ]


def build_gateway_container(lm: LocalModel, r: ReplicaPlan, options: RenderOptions) -> Manifest:
    """The slot gate sidecar (`localmodel gateway`), configured by environment."""
    mounts = [{"name": VOLUME_KEYS, "mountPath": KEYS_DIR, "readOnly": True}]
    return {
        "name": CONTAINER_GATEWAY,
        "image": lm.spec.gateway.image or options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": ["localmodel", "gateway"],
        "env": [*env_list(gateway_env(lm, r.tuning, options.router_key)),
                *router_env(options.router_key), *gateway_secret_env(lm)],
        "ports": [
            {"name": PORT_HTTP, "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": PORT_ADMIN, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        **({"volumeMounts": mounts} if lm.spec.gateway.auth is not None else {}),
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": PORT_HTTP},
            **probe_periods(lm.spec.idle is not None).readiness_fields(),
        },
        "livenessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": PORT_HTTP},
            "periodSeconds": probe_periods(lm.spec.idle is not None).liveness,
            "failureThreshold": 6,
        },
        "resources": resources(
            f"{gateway_cpu_milli(lm.spec.slots)}m",
            format_bytes(gateway_memory_bytes(lm.spec.slots, lm.spec.gateway.max_queue)),
        ),
        # Pod Security `restricted` whatever the engine's level: a numeric
        # non-root user (the operator image's), no capabilities, no privilege
        # escalation, a read-only root filesystem (it writes nothing: its
        # ledger and metrics are in memory, its log is stdout).
        "securityContext": container_security(read_only_root=True, uid=NONROOT_UID),
    }
