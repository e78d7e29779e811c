"""The probe's labels, annotation and the smallest patch that writes them only on change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.facts.machine import read_machine
from localmodel.facts.node import PROBE_FACTS_ANNOTATION, from_node
from localmodel.probe.node import PROCESS_FACTS, desired_metadata, is_probe_label, node_patch
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

TREES = Path(__file__).resolve().parents[1] / "fixtures" / "machines"


NODE = MakeNode("n1").memory_gib(128)


def _apply(metadata: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) on metadata's labels and annotations."""
    out = {k: dict(v) for k, v in metadata.items() if isinstance(v, dict)}
    for section, changes in ((patch or {}).get("metadata") or {}).items():
        target = out.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return out


def test_labels_and_annotation_read_back_as_the_same_node_facts() -> None:
    machine = read_machine(TREES / "smt-2numa-v2-quota")
    labels, annotations = desired_metadata(machine)
    before = NODE.manifest()
    patched = _apply(before["metadata"], node_patch(before["metadata"], labels, annotations))
    node = from_node({**before, "metadata": {"name": "n1", **patched}})
    assert node.physical_cores == 8
    assert node.threads_per_core == 2
    assert node.numa_nodes == 2
    assert node.hyperthreading is True
    assert node.has("AMXTILE") is True
    assert node.has("AVX512FP16") is True
    facts = json.loads(patched["annotations"][PROBE_FACTS_ANNOTATION])
    assert facts["numa_nodes"] == {"0": "0-3,8-11", "1": "4-7,12-15"}
    assert not PROCESS_FACTS & facts.keys()  # the probe pod's own cgroup is not the node's


def test_an_unchanged_node_gets_no_patch() -> None:
    machine = read_machine(TREES / "recorded-2cpu-v1")
    labels, annotations = desired_metadata(machine)
    metadata = {"labels": {**labels, "kubernetes.io/hostname": "vm"}, "annotations": annotations}
    assert node_patch(metadata, labels, annotations) is None


def test_a_vanished_feature_label_is_removed_and_foreign_labels_are_kept() -> None:
    labels, annotations = desired_metadata(read_machine(TREES / "recorded-2cpu-v1"))
    metadata = {
        "labels": {
            **labels,
            "localmodel.dev/cpu.AMXTILE": "true",  # the probe said so before; no more
            "feature.node.kubernetes.io/cpu-cpuid.AMXTILE": "true",  # NFD's, not ours
            "localmodel.dev/reserved": "batch",  # someone else's key in our prefix
        },
        "annotations": {"other": "x"},
    }
    patch = node_patch(metadata, labels, annotations)
    assert patch is not None
    assert patch["metadata"]["labels"] == {"localmodel.dev/cpu.AMXTILE": None}
    assert set(patch["metadata"]["annotations"]) == {PROBE_FACTS_ANNOTATION}


label_keys = st.sampled_from(
    ["localmodel.dev/cpu.AVX2", "localmodel.dev/cpu.AMXTILE", "localmodel.dev/cpu-vendor",
     "localmodel.dev/numa-nodes", "localmodel.dev/reserved", "kubernetes.io/hostname",
     "feature.node.kubernetes.io/cpu-cpuid.AVX2"]
)
label_maps = st.dictionaries(label_keys, st.sampled_from(["true", "false", "Intel", "2"]))


@settings(deadline=None)  # a loaded machine must not fail it
@given(current=label_maps, wanted=label_maps)
def test_patching_converges_in_one_step(current: dict[str, str], wanted: dict[str, str]) -> None:
    wanted = {k: v for k, v in wanted.items() if is_probe_label(k)}
    metadata: dict[str, Any] = {"labels": current}
    after = _apply(metadata, node_patch(metadata, wanted, {}))
    assert {k: v for k, v in after["labels"].items() if is_probe_label(k)} == wanted
    assert {k: v for k, v in after["labels"].items() if not is_probe_label(k)} == {
        k: v for k, v in current.items() if not is_probe_label(k)
    }
    assert node_patch(after, wanted, {}) is None
