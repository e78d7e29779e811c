"""Names, labels and owner references of what the renderer writes, and the
constants other modules need of it (the default operator image, the
gateway's port and size, the Service's port), without the renderer.

Every object carries the `localmodel.dev/name` label; pods, the Service and
the ConfigMap are owned by the LocalModel (garbage-collected with it);
weights claims are owned only when `storage.retain` is false, so by default
the weights survive deletion of the model.
"""

from __future__ import annotations

import math
from typing import Any

from localmodel import API_VERSION, KIND, __version__
from localmodel.api import LocalModel
from localmodel.contract import (
    APP_NAME,
    LABEL_APP_NAME,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    MANAGED_BY,
)
from localmodel.gateway_contract import GatewayConfig, client_api

DEFAULT_OPERATOR_IMAGE = f"ghcr.io/localmodel/localmodel-operator:{__version__}"
# The operator's namespace when none is told (the chart's usual release namespace).
DEFAULT_OPERATOR_NAMESPACE = "localmodel-system"
# Callers keep Ollama's port (the callers' API); the Service targets the gateway.
SERVICE_PORT = client_api.SERVICE_PORT
# The gateway's CPU limit, sized from benchmarks/gateway_sizing.py
# (docs/benchmarks.md, "The gateway's CPU at a pod's top speed"): every slot
# streaming at the engine's top speed through the gateway, its process's CPU
# time from /proc. The top speed is the fastest decode on one thread measured
# here for the smallest model in the catalog (Gemma 3 270M): 35.2 tok/s
# (Ollama; llama-server 33.0), `benchmarks/threads.py --quick` 2026-12-04
# (docs/benchmarks.md, The thread rule), rounded up. A faster CPU streams
# faster but also spends less CPU per token, so the share of a core is about
# the same. Measured in three runs at 8 and 16 slots (where the rule gives
# more than the least): at most 206 us of CPU per relayed token and 2.06 ms per
# request (its parse, admission, ledger record and log line). The rule: every
# slot at the top speed, answers of no fewer than 4 tokens (a request every 4
# tokens), twice that for headroom (the CPU per token moves by tens of
# percent from minute to minute on a VM, and a CFS quota throttles every
# 100 ms period a burst goes over: metrics scrapes, speed reads, the
# calibration, garbage collection). The least is 250m, the gateway's limit
# before this measurement (kept: its parse of a worst-case body,
# docs/benchmarks.md Hostile bodies, ran at it): 1 to 4 slots keep 250m,
# 8 slots get 418m, 16 slots 836m.
GATEWAY_CPU_MILLI = 250
TOP_TOKENS_PER_SECOND = 36.0
_CPU_PER_TOKEN = 210e-6
_CPU_PER_REQUEST = 2.06e-3
_TOKENS_PER_ANSWER = 4
_CPU_HEADROOM = 2.0


def gateway_cpu_milli(slots: int, tokens_per_second: float = TOP_TOKENS_PER_SECOND) -> int:
    """The gateway's CPU limit (millicores) for `slots` slots each streaming
    `tokens_per_second`: the rule above."""
    if slots < 1 or tokens_per_second <= 0:
        raise ValueError(f"slots ({slots}) and tokens_per_second ({tokens_per_second}): "
                         "must be positive")
    per_token = _CPU_PER_TOKEN + _CPU_PER_REQUEST / _TOKENS_PER_ANSWER
    need = slots * tokens_per_second * per_token * _CPU_HEADROOM
    return max(GATEWAY_CPU_MILLI, math.ceil(round(need * 1000, 6)))


# The gateway's memory limit, sized from benchmarks/gateway_hostile.py (the
# worst bodies at the queue's full depth with the rendered settings;
# docs/benchmarks.md, Hostile bodies). Measured at the default 1 MiB body
# limit: about 40 MiB at rest; the parse of one worst body about 26 times
# the body limit (parses run one at a time); each place of the slots and the
# queue holding a valid body of the limit about 2.2 times it (its bytes and
# its rewritten copy): 17 places (1 slot, maxQueue 16) peaked at 78 MiB with
# valid bodies only and 104 MiB with every kind mixed; 65 places at 180 and
# 213 MiB (this rule gives them 256 and 361 MiB).
# Hence 48 MiB + 30 x the limit + 2.5 x the limit a place, and half again
# for what the run did not hold (the ledger's 10,000 records, about 10 MiB;
# fragmentation). 256 MiB is the least: the default settings need 181 MiB.
GATEWAY_MEMORY_BYTES = 256 * 1024**2
_GATEWAY_AT_REST = 48 * 1024**2
_PARSE_TIMES_BODY = 30
_PLACE_TIMES_BODY = 2.5


def gateway_memory_bytes(slots: int, max_queue: int) -> int:
    """The gateway's memory limit for its slots and queue at the gateway's
    default body limit (the renderer sets no other), whole MiB."""
    body = GatewayConfig().max_body_bytes
    need = _GATEWAY_AT_REST + _PARSE_TIMES_BODY * body + _PLACE_TIMES_BODY * body * (
        slots + max_queue)
    mib = -(-int(need * 1.5) // 1024**2)
    return max(GATEWAY_MEMORY_BYTES, mib * 1024**2)


def pod_name(lm: LocalModel, replica: int) -> str:
    return f"{lm.metadata.name}-{replica}"


def claim_name(lm: LocalModel, replica: int) -> str:
    return f"{lm.metadata.name}-weights-{replica}"


def configmap_name(lm: LocalModel) -> str:
    return f"{lm.metadata.name}-modelfile"


def endpoint(lm: LocalModel) -> str:
    return f"http://{lm.metadata.name}.{lm.metadata.namespace}.svc:{SERVICE_PORT}"


def pod_selector(lm: LocalModel) -> str:
    """The label selector of a LocalModel's pods, as the scale subresource reports it."""
    return f"{LABEL_NAME}={lm.metadata.name}"


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


def claim_owned(lm: LocalModel) -> bool:
    """Whether the model's weights claims carry its owner reference (are
    collected with it): not when `storage.retain`, nor offline (no uid)."""
    return not lm.spec.storage.retain and bool(owner_reference(lm))


class Meta:
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
