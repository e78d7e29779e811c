"""The slot gate sidecar (`localmodel gateway`) in a model's pod, configured
by environment."""

from __future__ import annotations

from localmodel.api import LocalModel
from localmodel.contract import CONTAINER_GATEWAY, PORT_HTTP
from localmodel.engines.pod import Manifest, env_list, resources
from localmodel.engines.registry import engine
from localmodel.facts.quantity import format_bytes
from localmodel.render.names import GATEWAY_CPU_MILLI, GATEWAY_MEMORY_BYTES, GATEWAY_PORT
from localmodel.render.plan import RenderOptions, ReplicaPlan
from localmodel.rules import Tuning


def gateway_env(lm: LocalModel, tuning: Tuning) -> dict[str, str]:
    """Flags for `localmodel gateway`, as LOCALMODEL_GATEWAY_* variables (the
    overflow's API key is not among them: see `gateway_secret_env`)."""
    gw, spec = lm.spec.gateway, lm.spec
    overflow: dict[str, str] = {}
    if gw.overflow is not None:
        overflow = {
            "LOCALMODEL_GATEWAY_OVERFLOW_URL": gw.overflow.url,
            "LOCALMODEL_GATEWAY_OVERFLOW_MODEL": gw.overflow.model,
            "LOCALMODEL_GATEWAY_OVERFLOW_AFTER": f"{gw.overflow.after:g}",
        }
    return overflow | {
        "LOCALMODEL_GATEWAY_UPSTREAM": f"http://127.0.0.1:{engine(spec.engine.name).port}",
        "LOCALMODEL_GATEWAY_ENGINE": spec.engine.name.value,
        "LOCALMODEL_GATEWAY_LISTEN": f"0.0.0.0:{GATEWAY_PORT}",
        "LOCALMODEL_GATEWAY_MODEL": spec.model,
        "LOCALMODEL_GATEWAY_SLOTS": str(spec.slots),
        "LOCALMODEL_GATEWAY_THREADS": str(tuning.threads),
        "LOCALMODEL_GATEWAY_CONTEXT": str(spec.context),
        "LOCALMODEL_GATEWAY_MAX_QUEUE": str(gw.max_queue),
        "LOCALMODEL_GATEWAY_DEADLINE": str(gw.deadline_seconds),
        "LOCALMODEL_GATEWAY_MAX_TOKENS": str(gw.max_tokens),
        "LOCALMODEL_GATEWAY_KEEP_ALIVE": spec.keep_alive,
    }


def gateway_secret_env(lm: LocalModel) -> list[Manifest]:
    """The overflow's API key, mapped from its Secret: the key itself never
    passes through the operator, the pod spec or its hash."""
    overflow = lm.spec.gateway.overflow
    if overflow is None or overflow.api_key_secret_ref is None:
        return []
    ref = overflow.api_key_secret_ref
    return [
        {
            "name": "LOCALMODEL_GATEWAY_OVERFLOW_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    ]


def build_gateway_container(lm: LocalModel, r: ReplicaPlan, options: RenderOptions) -> Manifest:
    """The slot gate sidecar (`localmodel gateway`), configured by environment."""
    return {
        "name": CONTAINER_GATEWAY,
        "image": lm.spec.gateway.image or options.operator_image,
        "imagePullPolicy": options.pull_policy,
        "command": ["localmodel", "gateway"],
        "env": [*env_list(gateway_env(lm, r.tuning)), *gateway_secret_env(lm)],
        "ports": [{"name": PORT_HTTP, "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": PORT_HTTP},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": PORT_HTTP},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": resources(f"{GATEWAY_CPU_MILLI}m", format_bytes(GATEWAY_MEMORY_BYTES)),
    }
