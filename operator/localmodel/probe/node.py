"""The node probe's loop: read this machine, label and annotate its Node on change.

`desired_metadata` and `node_patch` are pure: facts in, the labels and
annotation the Node should carry out, then the smallest merge patch that gets
it there (``None`` when nothing changed, so an unchanged node is never
written). `run` is the shell: it reads the facts, GETs the Node, PATCHes it when
the patch is not empty, sleeps, and again.

The probe owns exactly the label keys `is_probe_label` accepts and the
``localmodel.dev/node-facts`` annotation: a label it no longer sets (a feature
that disappeared) is removed; every other label and annotation is left alone.
The memory bandwidth is measured now and then (`probe/memory.py`); between
measurements, and within ``BANDWIDTH_CHANGE`` of the number the node carries,
the node keeps its labels (`kept_bandwidth`): a measurement's noise writes nothing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from localmodel.facts.machine import MachineFacts
from localmodel.facts.model import MemoryBandwidth
from localmodel.facts.node import (
    PROBE_BANDWIDTH_KEYS,
    PROBE_FACTS_ANNOTATION,
    PROBE_NUMA_NODES,
    PROBE_PREFIX,
    bandwidth_from_labels,
)
from localmodel.probe.labels import bandwidth_labels, probe_labels

__all__ = [
    "PROCESS_FACTS",
    "ProbeResult",
    "desired_metadata",
    "is_probe_label",
    "kept_bandwidth",
    "node_patch",
    "run",
]

# Facts about the probe's own process (its pod's cgroup and cpuset), not its node:
# they stay out of the node annotation.
PROCESS_FACTS = frozenset(
    {"hostname", "cpu_budget", "cpuset_cpus", "cgroup_cpu_quota", "cgroup_memory_bytes",
     "memory_bytes"}
)


def is_probe_label(key: str) -> bool:
    """Whether the probe owns this label key (and may remove it)."""
    return (key.startswith((PROBE_PREFIX + "cpu.", PROBE_PREFIX + "cpu-"))
            or key == PROBE_NUMA_NODES or key in PROBE_BANDWIDTH_KEYS)


# A measured bandwidth within this share of the node's labels leaves them as they are.
BANDWIDTH_CHANGE = 0.10


def kept_bandwidth(current: Mapping[str, str], measured: MemoryBandwidth | None
                   ) -> MemoryBandwidth | None:
    """The bandwidth the node should carry: the one its labels say (read as the operator reads
    them, junk dropped) unless a measurement differs from it by more than BANDWIDTH_CHANGE
    (or measured a thread count it lacks); with no measurement, the labels' own."""
    labelled, _ = bandwidth_from_labels(current)
    if measured is None or labelled is None:
        return measured or labelled
    same = (labelled.threads == measured.threads
            and _near(labelled.one_thread, measured.one_thread)
            and _near(labelled.all_threads, measured.all_threads))
    return labelled if same else measured


def _near(old: int | None, new: int | None) -> bool:
    if old is None or new is None:
        return old == new
    return abs(new - old) <= BANDWIDTH_CHANGE * old


def desired_metadata(facts: MachineFacts, bandwidth: MemoryBandwidth | None = None
                     ) -> tuple[dict[str, str], dict[str, str]]:
    """The probe's labels (with ``bandwidth``'s, when known) and its one annotation (the
    node's facts as JSON)."""
    node_facts = {k: v for k, v in facts.as_json().items() if k not in PROCESS_FACTS}
    annotation = json.dumps(node_facts, sort_keys=True, separators=(",", ":"))
    labels = probe_labels(facts.node)
    if bandwidth is not None:
        labels.update(bandwidth_labels(bandwidth))
    return labels, {PROBE_FACTS_ANNOTATION: annotation}


def node_patch(
    metadata: Mapping[str, Any], labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any] | None:
    """The merge patch that gives a Node with ``metadata`` exactly the probe's labels
    and annotation (other keys untouched); ``None`` when it already has them."""
    current_labels: Mapping[str, str] = metadata.get("labels") or {}
    current_annotations: Mapping[str, str] = metadata.get("annotations") or {}
    label_patch: dict[str, str | None] = {
        k: v for k, v in labels.items() if current_labels.get(k) != v
    }
    label_patch.update(
        {k: None for k in current_labels if is_probe_label(k) and k not in labels}
    )
    annotation_patch = {
        k: v for k, v in annotations.items() if current_annotations.get(k) != v
    }
    patch: dict[str, Any] = {}
    if label_patch:
        patch["labels"] = dict(sorted(label_patch.items()))
    if annotation_patch:
        patch["annotations"] = annotation_patch
    return {"metadata": patch} if patch else None


@dataclass(frozen=True)
class ProbeResult:
    """Decides the probe's write: whether the node's labels or annotations change, and the patch."""

    changed: bool
    patch: dict[str, Any] | None


def probe_once(core: Any, node: str, facts: MachineFacts,
               measured: MemoryBandwidth | None = None) -> ProbeResult:
    """GET the node, PATCH it if its probe labels or annotation differ."""
    current = core.read_node(node)
    metadata = core.api_client.sanitize_for_serialization(current.metadata) or {}
    bandwidth = kept_bandwidth(metadata.get("labels") or {}, measured)
    labels, annotations = desired_metadata(facts, bandwidth)
    patch = node_patch(metadata, labels, annotations)
    if patch is not None:
        core.patch_node(node, patch, _content_type="application/merge-patch+json")
    return ProbeResult(changed=patch is not None, patch=patch)


def run(
    core: Any,
    node: str,
    read_facts: Callable[[], MachineFacts],
    *,
    interval: float,
    once: bool,
    log: TextIO = sys.stderr,
    sleep: Callable[[float], None] = time.sleep,
    bandwidth: Callable[[], MemoryBandwidth | None] | None = None,
) -> int:
    """Probe ``node`` every ``interval`` seconds (once with ``once``); ``bandwidth`` gives the
    latest memory bandwidth measured (and measures when it is due: `probe/memory.py`).

    An API error (or an unreadable file) is logged and retried at the next
    interval; with ``once`` it ends the run with status 1.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    while True:
        try:
            measured = bandwidth() if bandwidth is not None else None
            result = probe_once(core, node, read_facts(), measured)
        except ApiException as e:
            print(
                f"localmodel probe: node {node}: {e.status} {e.reason}: {_message(e)}",
                file=log,
                flush=True,
            )
            if once:
                return 1
        except (HTTPError, OSError, ValueError) as e:  # API unreachable; unreadable file
            print(f"localmodel probe: node {node}: {e}", file=log, flush=True)
            if once:
                return 1
        else:
            if result.changed and result.patch is not None:
                changed = sorted(
                    {**result.patch["metadata"].get("labels", {}),
                     **result.patch["metadata"].get("annotations", {})}
                )
                print(f"localmodel probe: node {node}: updated {', '.join(changed)}",
                      file=log, flush=True)
            else:
                print(f"localmodel probe: node {node}: unchanged", file=log, flush=True)
            if once:
                return 0
        sleep(interval)


def _message(e: Any) -> str:
    try:
        return str(json.loads(e.body).get("message", e.body))
    except (TypeError, ValueError, AttributeError):
        return str(e.body)
