"""doctor says the cluster's gaps as the operator does (localmodel/gaps.py):
each model's pods, read here, for an image the kubelet cannot pull, a container
that keeps failing or a pod the scheduler left Unschedulable (so doctor says it
with no operator running), else what the model's status says (a claim's
StorageClass: doctor does not read claims or classes). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from localmodel.contract import LABEL_NAME, LABEL_REPLICA
from localmodel.doctor.report import Finding, Verdict
from localmodel.gaps import Gap, PodState, failing_containers, image_waits, model_gap
from localmodel.printable import printable
from localmodel.status import GAP_REASONS

FIX = "change what the message names (docs/operator.md, The cluster's gaps)"


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = _map(obj, "status").get("conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def pod_state(pod: Mapping[str, Any]) -> PodState:
    meta, status = _map(pod, "metadata"), _map(pod, "status")
    conditions = _conditions(pod)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    stuck = next((str(c.get("message") or "") for c in conditions
                  if c.get("type") == "PodScheduled" and c.get("status") == "False"
                  and c.get("reason") == "Unschedulable"), None)
    replica = str(_map(meta, "labels").get(LABEL_REPLICA, ""))
    return PodState(int(replica) if replica.isdigit() else 0, str(meta.get("name") or ""),
                    ready, image_waits(status), stuck,
                    failing_containers(_map(pod, "spec"), status))


def _stored(model: Mapping[str, Any]) -> Gap | None:
    ready = next((c for c in _conditions(model) if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "False" or ready.get("reason") not in GAP_REASONS:
        return None
    return Gap(str(ready["reason"]), printable(str(ready.get("message") or ""), 1200))


def gap_findings(models: Iterable[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
                 ) -> list[Finding]:
    """One FAIL per model with a gap: its pods' own, else its status's."""
    by_model: dict[tuple[str, str], list[PodState]] = {}
    for pod in pods:
        meta = _map(pod, "metadata")
        name = _map(meta, "labels").get(LABEL_NAME)
        if name and not meta.get("deletionTimestamp"):
            by_model.setdefault((str(meta.get("namespace") or ""), str(name)), []).append(
                pod_state(pod))
    out = []
    for model in models:
        meta = _map(model, "metadata")
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        gap = model_gap(key[0], by_model.get(key, []), [], None) or _stored(model)
        if gap is not None:
            out.append(Finding("gaps", Verdict.FAIL,
                               f"LocalModel {key[0]}/{printable(key[1], 253)}: {gap.reason}: "
                               f"{gap.message}", FIX))
    return out
