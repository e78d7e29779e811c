"""NodeFacts from Node objects: budget, taints, NFD and probe CPU labels, errors with paths."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.facts import FactSource, Taint
from localmodel.facts.flags import NFD_UNLABELLED_BY_DEFAULT
from localmodel.facts.node import NodeFactsError, from_node, from_node_list

pytestmark = pytest.mark.unit

NFD = "feature.node.kubernetes.io/"

# As `kubectl get nodes -o yaml` prints it (trimmed): an AMX node with NFD.
KUBECTL_LIST = """\
apiVersion: v1
items:
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      beta.kubernetes.io/arch: amd64
      feature.node.kubernetes.io/cpu-cpuid.AMXBF16: "true"
      feature.node.kubernetes.io/cpu-cpuid.AMXINT8: "true"
      feature.node.kubernetes.io/cpu-cpuid.AMXTILE: "true"
      feature.node.kubernetes.io/cpu-cpuid.AVX2: "true"
      feature.node.kubernetes.io/cpu-cpuid.AVX512F: "true"
      feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI: "true"
      feature.node.kubernetes.io/cpu-cpuid.FMA3: "true"
      feature.node.kubernetes.io/cpu-hardware_multithreading: "true"
      feature.node.kubernetes.io/cpu-model.family: "6"
      feature.node.kubernetes.io/cpu-model.id: "143"
      feature.node.kubernetes.io/cpu-model.vendor_id: Intel
      kubernetes.io/hostname: amx-1
    name: amx-1
  spec:
    taints:
    - effect: NoSchedule
      key: dedicated
      value: llm
  status:
    allocatable:
      cpu: 7910m
      ephemeral-storage: "95491281146"
      memory: 31856652Ki
      pods: "110"
    capacity:
      cpu: "8"
      memory: 32761356Ki
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      kubernetes.io/hostname: plain-1
    name: plain-1
  spec:
    unschedulable: true
  status:
    allocatable:
      cpu: "4"
      memory: 16Gi
kind: List
metadata:
  resourceVersion: ""
"""


def node_object(
    name: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    cpu: Any = "4",
    memory: Any = "16Gi",
    **extra: Any,
) -> dict[str, Any]:
    """A Node object as written, its allocatable values raw (valid or not) and any
    other top-level field (`spec`, `kind`...) as given: what `from_node` parses.
    Valid nodes of the other tests come from tests/builders.py's `MakeNode`."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }
    obj.update(extra)
    return obj


def test_kubectl_list_output_is_read_field_by_field() -> None:
    amx, plain = from_node_list(yaml.safe_load(KUBECTL_LIST))

    assert amx.name == "amx-1"
    assert amx.allocatable_cpu_milli == 7910
    assert amx.allocatable_memory_bytes == 31856652 * 1024
    assert amx.taints == (Taint(key="dedicated", value="llm", effect="NoSchedule"),)
    assert amx.schedulable is True
    assert amx.source is FactSource.NFD
    assert amx.cpu_flags == frozenset(
        {"AMXBF16", "AMXINT8", "AMXTILE", "AVX2", "AVX512F", "AVX512VNNI", "FMA3"}
    )
    assert (amx.cpu_vendor, amx.cpu_family, amx.cpu_model_id) == ("Intel", "6", "143")
    assert amx.hyperthreading is True
    assert amx.labels["kubernetes.io/hostname"] == "amx-1"
    assert amx.cpuset_cpus is None and amx.cgroup_cpu_quota is None  # remote node

    assert plain.name == "plain-1"
    assert plain.schedulable is False
    assert plain.allocatable_cpu_milli == 4000
    assert plain.allocatable_memory_bytes == 16 * 2**30


def test_node_without_cpu_labels_has_unknown_features_not_absent_ones() -> None:
    facts = from_node(node_object(labels={"kubernetes.io/hostname": "n1"}))
    assert facts.cpu_flags is None
    assert facts.source is FactSource.NONE
    assert facts.has("AMXTILE") is None
    assert facts.has("AVX2") is None
    assert facts.hyperthreading is None and facts.cpu_vendor is None


def test_nfd_without_a_flag_label_means_the_flag_is_absent() -> None:
    facts = from_node(node_object(labels={NFD + "cpu-cpuid.AVX2": "true"}))
    assert facts.has("AVX2") is True
    assert facts.has("amxtile") is False  # case-insensitive lookup


def test_nfd_cpu_model_labels_alone_mean_nfd_ran_and_found_no_flags() -> None:
    facts = from_node(node_object(labels={NFD + "cpu-model.vendor_id": "AMD"}))
    assert facts.source is FactSource.NFD
    assert facts.cpu_flags == frozenset()
    assert facts.has("AVX2") is False


def test_features_nfd_does_not_label_by_default_stay_unknown_on_nfd_nodes() -> None:
    labels = {NFD + "cpu-cpuid.AVX2": "true", NFD + "cpu-cpuid.F16C": "true"}
    facts = from_node(node_object(labels=labels))
    assert "F16C" in NFD_UNLABELLED_BY_DEFAULT
    assert facts.has("F16C") is True  # present when labelled (custom NFD config)
    assert facts.has("SSE42") is None  # blacklisted by default: no label proves nothing
    assert facts.has("AVX512F") is False


def test_non_true_nfd_values_are_not_flags() -> None:
    labels = {NFD + "cpu-cpuid.AVX2": "true", NFD + "cpu-cpuid.AVX10_VERSION": "1",
              NFD + "cpu-cpuid.AVX512F": "false"}  # fmt: skip
    facts = from_node(node_object(labels=labels))
    assert facts.cpu_flags == frozenset({"AVX2"})


def test_probe_labels_are_read_when_nfd_is_absent() -> None:
    facts = from_node(
        node_object(
            labels={
                "localmodel.dev/cpu-flags-known": "true",
                "localmodel.dev/cpu.AVX2": "true",
                "localmodel.dev/cpu.AMXTILE": "true",
                "localmodel.dev/cpu-vendor": "Intel",
                "localmodel.dev/cpu-family": "6",
                "localmodel.dev/cpu-model-id": "143",
                "localmodel.dev/cpu-hyperthreading": "false",
            }
        )
    )
    assert facts.source is FactSource.PROBE
    assert facts.cpu_flags == frozenset({"AVX2", "AMXTILE"})
    assert facts.has("AVX512F") is False  # in the probe list, not labelled: absent
    assert facts.has("SHA") is None  # outside the probe list: unknown
    assert (facts.cpu_vendor, facts.cpu_family, facts.cpu_model_id) == ("Intel", "6", "143")
    assert facts.hyperthreading is False


def test_probe_flag_labels_without_the_known_marker_are_not_trusted() -> None:
    facts = from_node(node_object(labels={"localmodel.dev/cpu.AVX2": "true"}))
    assert facts.cpu_flags is None and facts.source is FactSource.NONE


def test_nfd_wins_over_the_probe_field_by_field() -> None:
    labels = {
        NFD + "cpu-cpuid.AVX2": "true",
        NFD + "cpu-model.vendor_id": "AMD",
        "localmodel.dev/cpu-flags-known": "true",
        "localmodel.dev/cpu.AMXTILE": "true",
        "localmodel.dev/cpu-vendor": "Intel",
        "localmodel.dev/cpu-family": "25",
        "localmodel.dev/cpu-hyperthreading": "true",
    }
    facts = from_node(node_object(labels=labels))
    assert facts.source is FactSource.NFD
    assert facts.cpu_flags == frozenset({"AVX2"})
    assert facts.cpu_vendor == "AMD"
    # NFD said nothing about these: the probe fills them in.
    assert facts.cpu_family == "25"
    assert facts.hyperthreading is True


def test_capacity_is_the_fallback_when_allocatable_is_missing() -> None:
    obj = node_object()
    obj["status"] = {"allocatable": {"memory": "8Gi"}, "capacity": {"cpu": "2", "memory": "9Gi"}}
    facts = from_node(obj)
    assert facts.allocatable_cpu_milli == 2000
    assert facts.allocatable_memory_bytes == 8 * 2**30


def test_multi_document_yaml_is_accepted_and_empty_documents_skipped() -> None:
    a, b = yaml.safe_dump(node_object("a")), yaml.safe_dump(node_object("b"))
    text = "---\n" + a + "---\n" + b + "---\n"
    facts = from_node_list(list(yaml.safe_load_all(text)))
    assert [f.name for f in facts] == ["a", "b"]


def test_a_single_node_and_a_nodelist_are_accepted() -> None:
    assert [f.name for f in from_node_list(node_object("solo"))] == ["solo"]
    items = [node_object("x"), node_object("y")]
    nodelist = {"kind": "NodeList", "apiVersion": "v1", "items": items}
    assert [f.name for f in from_node_list(nodelist)] == ["x", "y"]
    assert from_node_list({"kind": "List", "items": []}) == []


def _with(obj: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    target: Any = obj
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DELETE = object()


AVX2_LABEL = NFD + "cpu-cpuid.AVX2"
ALLOC = ["status", "allocatable"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ([*ALLOC, "cpu"], "abc", 'status.allocatable.cpu: "abc" is not a CPU quantity'),
        ([*ALLOC, "cpu"], "-1", 'status.allocatable.cpu: "-1" is not a CPU quantity'),
        ([*ALLOC, "memory"], "lots", 'status.allocatable.memory: "lots" is not a memory quantity'),
        ([*ALLOC, "cpu"], _DELETE, "status.allocatable.cpu: missing"),
        (["status"], _DELETE, "status: missing"),
        (["status"], "up", "status: expected a mapping"),
        (["metadata", "name"], "", "metadata.name: missing"),
        (["metadata", "name"], 7, "metadata.name: missing or not a non-empty string"),
        (["metadata", "labels"], ["a"], "metadata.labels: expected a mapping"),
        (["metadata", "labels"], {AVX2_LABEL: True},
         f"metadata.labels[{AVX2_LABEL!r}]: True is not a string"),
        (["kind"], "Pod", "kind: expected Node, got 'Pod'"),
        (["spec"], {"unschedulable": "yes"}, "spec.unschedulable: 'yes' is not a boolean"),
        (["spec"], {"taints": {"key": "a"}}, "spec.taints: expected a list of taints"),
        (["spec"], {"taints": [{"key": "a", "effect": "Sometimes"}]},
         "spec.taints[0].effect: 'Sometimes' is not one of"),
        (["spec"], {"taints": [{"effect": "NoSchedule"}]}, "spec.taints[0].key: missing"),
    ],
)  # fmt: skip
def test_invalid_nodes_raise_an_error_naming_the_field_path(
    path: list[str | int], value: Any, message: str
) -> None:
    good = [node_object("a"), node_object("b")]
    bad = _with(node_object("c"), path, value)
    with pytest.raises(NodeFactsError) as excinfo:
        from_node_list({"apiVersion": "v1", "kind": "List", "items": [*good, bad]})
    assert str(excinfo.value).startswith("items[2]." + message)
    assert isinstance(excinfo.value, ValueError)


def test_errors_in_multi_document_input_name_the_document() -> None:
    with pytest.raises(NodeFactsError, match=r'^\[1\]\.status\.allocatable\.cpu: "x"'):
        from_node_list([node_object("a"), node_object("b", cpu="x")])
    with pytest.raises(NodeFactsError, match=r"^\[0\]\.items\[1\]\.metadata\.name"):
        from_node_list([{"kind": "List", "items": [node_object("a"), node_object("")]}])


def test_duplicate_node_names_are_rejected() -> None:
    with pytest.raises(
        NodeFactsError, match=r"^items\[1\]\.metadata\.name: duplicate node name 'a'"
    ):
        from_node_list({"kind": "List", "items": [node_object("a"), node_object("a")]})


def test_non_node_input_is_rejected() -> None:
    with pytest.raises(NodeFactsError):
        from_node_list("nodes")  # type: ignore[arg-type]
    with pytest.raises(NodeFactsError, match="items"):
        from_node_list({"kind": "List", "items": "n1"})


def test_taint_defaults() -> None:
    facts = from_node(node_object(spec={"taints": [{"key": "k", "effect": "NoExecute"}]}))
    assert facts.taints == (Taint(key="k", value="", effect="NoExecute"),)


cpu_milli = st.integers(min_value=0, max_value=10**7)
memory_bytes = st.integers(min_value=0, max_value=2**50)
flag_names = st.sampled_from(["AVX", "AVX2", "AVX512F", "AVX512VNNI", "AMXTILE", "AMXBF16",
                              "AMXINT8", "FMA3", "SHA", "AVXVNNI"])  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(cpu_milli, memory_bytes, st.frozensets(flag_names))
def test_budget_and_nfd_flags_are_read_back_exactly(
    milli: int, memory: int, flags: frozenset[str]
) -> None:
    labels = {NFD + "cpu-cpuid." + flag: "true" for flag in flags}
    labels[NFD + "cpu-model.vendor_id"] = "Intel"  # NFD ran even when no flag is set
    facts = from_node(node_object(labels=labels, cpu=f"{milli}m", memory=str(memory)))
    assert facts.allocatable_cpu_milli == milli
    assert facts.allocatable_memory_bytes == memory
    assert facts.cpu_flags == flags
    for flag in ["AVX2", "AMXTILE", "AVX512F"]:
        assert facts.has(flag) is (flag in flags)
