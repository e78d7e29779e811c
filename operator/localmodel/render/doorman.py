"""The doorman's pod (`<name>-doorman`): what answers a released sleeper's
own Service (docs/idle.md, Through the model's own Service). Pure.

It is the gateway's image run as `localmodel gateway --doorman`
(gateway/doorman.py): no engine, no weights claim, no node chosen by the
planner (kube-scheduler places it: no affinity, no nodeName, the model's own
nodeSelector and tolerations, so it lands where the tenant's pods may). Its
labels are the model's with `localmodel.dev/role: doorman` and without
`localmodel.dev/replica`: the Service and the NetworkPolicy select it by
`localmodel.dev/name`, the router never takes it for a replica (its name,
router/cluster.py), and the operator counts it as node usage, never as a
replica (controller/objects.py `owned_pod` needs the replica label).

What it mounts and runs as is the gateway container's: the API keys' Secret
(it checks keys, and answers the router's key check), Pod Security
`restricted`. Not the overflow endpoint's key: the doorman never proxies,
so it holds no credential it does not use.

The operator creates it when a model is released and deletes it when the
model's first replica is Ready (controller, issue 44's operator part): see
`doorman_objects`.
"""

from __future__ import annotations

import math

from localmodel.api import LocalModel
from localmodel.contract import (
    CONTAINER_GATEWAY,
    DOORMAN_SUFFIX,
    LABEL_ROLE,
    PORT_ADMIN,
    PORT_HTTP,
    ROLE_DOORMAN,
    VOLUME_KEYS,
)
from localmodel.gateway_contract import (
    ADMIN_PORT,
    GATEWAY_PORT,
    HEALTH_PATH,
    READY_PATH,
    env_name,
    gateway_variables,
)
from localmodel.podspec import NONROOT_UID, Manifest, container_security, env_list, resources
from localmodel.podspec import seccomp as _seccomp
from localmodel.render.gateway import KEYS_DIR, KEYS_FILE, gateway_volumes
from localmodel.render.names import Meta
from localmodel.render.plan import RenderOptions

# Requests = limits, to be measured (the kwok mode of benchmarks/idle.py and
# the real node): an idle aiohttp process answering small errors.
DOORMAN_CPU = "50m"
DOORMAN_MEMORY = "64Mi"
MAX_WAKE_SECONDS = 3600  # a Retry-After past an hour is no use to a caller: capped


def doorman_name(lm: LocalModel) -> str:
    return lm.metadata.name + DOORMAN_SUFFIX


def wants_doorman(lm: LocalModel) -> bool:
    """Only a model that may sleep gets one: `spec.idle`, its gateway on, and
    not off (`replicas: 0` beats sleep: nothing wakes, nothing to tell)."""
    return lm.spec.idle is not None and lm.spec.gateway.enabled and lm.spec.replicas > 0


def doorman_env(lm: LocalModel, router_url: str, wake_seconds: float | None) -> list[Manifest]:
    """The doorman's flags as LOCALMODEL_GATEWAY_* variables, and its pod's
    namespace (which names the model to callers) from the downward API."""
    spec = lm.spec
    flags = {
        "engine": spec.engine.name.value,
        "model": spec.model,
        "listen": f"0.0.0.0:{GATEWAY_PORT}",
        "admin-listen": f"0.0.0.0:{ADMIN_PORT}",
    }
    if spec.gateway.auth is not None:
        flags["keys-file"] = KEYS_FILE
    if router_url:
        flags["router-url"] = router_url
    if wake_seconds is not None and math.isfinite(wake_seconds) and wake_seconds > 0:
        flags["wake-seconds"] = str(min(MAX_WAKE_SECONDS, math.ceil(wake_seconds)))
    identity = [{"name": env_name(flag), "valueFrom": {"fieldRef": {"fieldPath": path}}}
                for flag, path in (("pod-namespace", "metadata.namespace"),
                                   ("pod-name", "metadata.name"))]
    return [*env_list(gateway_variables(flags)), *identity]


def doorman_container(lm: LocalModel, options: RenderOptions, router_url: str,
                      wake_seconds: float | None) -> Manifest:
    """The gateway container, as `localmodel gateway --doorman`."""
    container: Manifest = {
        "name": CONTAINER_GATEWAY,
        "image": lm.spec.gateway.image or options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": ["localmodel", "gateway", "--doorman"],
        "env": doorman_env(lm, router_url, wake_seconds),
        "ports": [
            {"name": PORT_HTTP, "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": PORT_ADMIN, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": READY_PATH, "port": PORT_HTTP},
                           "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": HEALTH_PATH, "port": PORT_HTTP},
                          "periodSeconds": 10, "failureThreshold": 6},
        "resources": resources(DOORMAN_CPU, DOORMAN_MEMORY),
        "securityContext": container_security(read_only_root=True, uid=NONROOT_UID),
    }
    if lm.spec.gateway.auth is not None:
        container["volumeMounts"] = [{"name": VOLUME_KEYS, "mountPath": KEYS_DIR,
                                      "readOnly": True}]
    return container


def doorman_pod(lm: LocalModel, options: RenderOptions, router_url: str = "",
                wake_seconds: float | None = None) -> Manifest:
    """The doorman's Pod manifest (whether the model wants one: `wants_doorman`)."""
    spec: Manifest = {
        "containers": [doorman_container(lm, options, router_url, wake_seconds)],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # it calls no API server
        "securityContext": {"runAsNonRoot": True, **_seccomp()},
    }
    volumes = gateway_volumes(lm)
    if volumes:
        spec["volumes"] = volumes
    if options.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    placement = lm.spec.placement
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True, mode="json")
                               for t in placement.tolerations]
    meta = Meta(lm)(doorman_name(lm))
    meta["labels"] = {**meta["labels"], LABEL_ROLE: ROLE_DOORMAN}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def doorman_objects(lm: LocalModel, options: RenderOptions, *, router_url: str = "",
                    wake_seconds: float | None = None) -> list[Manifest]:
    """What a released model's doorman is: its Pod, or nothing for a model
    that may not sleep (`wants_doorman`). `router_url`: the router's address
    the doorman names to callers (the operator knows it with the router on);
    `wake_seconds`: the model's last wake (`status.idle.lastWake.seconds`),
    its Retry-After, rounded up, at most an hour.

    The operator applies it when it releases the model (the pods deleted
    after their gateways closed) and deletes it once the model's first
    replica is Ready (a request in the moment before the Service drops it is
    told to come back in `Retry-After`). A resident sleeper needs none."""
    if not wants_doorman(lm):
        return []
    return [doorman_pod(lm, options, router_url, wake_seconds)]
