"""tests/builders.py: what each builder builds, and that it builds it the operator's way."""

from __future__ import annotations

import pytest

from localmodel.api import LocalModel
from localmodel.errors import InvalidObject
from localmodel.facts import FactSource, NodeFacts, Taint, from_node
from tests.builders import GiB, MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit


def test_a_local_model_is_parsed_the_operators_way() -> None:
    lm = MakeLocalModel("chat").cpu(2).replicas(3).uid("u1").generation(4).obj()
    assert isinstance(lm, LocalModel)
    assert (lm.metadata.name, lm.metadata.namespace, lm.metadata.uid) == ("chat", "ai", "u1")
    assert lm.metadata.generation == 4
    assert (lm.spec.model, lm.spec.cpu, lm.spec.replicas) == ("qwen3:1.7b", 2, 3)
    # parse_local_model drops a null as the API server does: the default applies.
    assert MakeLocalModel("m").spec(context=None).obj().spec.context == 8192


def test_an_invalid_local_model_is_refused_as_the_operator_refuses_it() -> None:
    with pytest.raises(InvalidObject) as err:
        MakeLocalModel("m").spec(cpu=0).obj()
    assert err.value.name == "ai/m" and err.value.errors[0].field_path == "spec.cpu"


def test_a_manifest_is_the_object_as_written() -> None:
    base = MakeLocalModel("g").namespace(None).spec(model="gemma3:270m", cpu=2)
    assert base.engine("llama-server").gguf(sha256="a" * 64).without("cpu").manifest() == {
        "apiVersion": "localmodel.dev/v1alpha1",
        "kind": "LocalModel",
        "metadata": {"name": "g"},
        "spec": {"model": "gemma3:270m", "engine": {"name": "llama-server"},
                 "gguf": {"url": "https://models.example/gemma-3-270m-q4_k_m.gguf",
                          "sha256": "a" * 64}},
    }


def test_builders_are_values_a_refinement_leaves_its_base_alone() -> None:
    base = MakeLocalModel("m").cpu(4)
    base.cpu(8).uid("x")
    assert base.manifest()["spec"] == {"model": "qwen3:1.7b", "cpu": 4}
    assert "uid" not in base.manifest()["metadata"]
    node = MakeNode("n")
    node.cpus(2).labels(pool="a")
    assert node.facts() == MakeNode("n").facts()


def test_node_facts_and_the_node_object_say_the_same() -> None:
    b = (MakeNode("n1").cpus(7.5).memory_gib(30).hostname_label().labels(pool="a")
         .cpu_flags({"AVX2"}).taints(Taint("dedicated", "llm")).uid("uid-n1"))
    facts = b.facts()
    assert facts == NodeFacts(
        name="n1", allocatable_cpu_milli=7500, allocatable_memory_bytes=30 * GiB,
        labels={"kubernetes.io/hostname": "n1", "pool": "a"},
        taints=(Taint("dedicated", "llm"),), cpu_flags=frozenset({"AVX2"}),
        source=FactSource.NFD,
    )
    node = b.manifest()
    assert node["metadata"]["uid"] == "uid-n1"
    assert node["status"]["allocatable"] == {"cpu": "7500m", "memory": "30Gi"}
    read = from_node(node)
    assert (read.name, read.allocatable_cpu_milli, read.allocatable_memory_bytes) == (
        "n1", 7500, 30 * GiB)
    assert (read.taints, read.source, read.has("AVX2")) == (facts.taints, FactSource.NFD, True)


def test_a_node_with_unknown_features_and_machine_facts() -> None:
    facts = MakeNode("n").cpu_flags(None).unschedulable().with_facts(cgroup_cpu_quota=2.0).facts()
    assert (facts.cpu_flags, facts.source, facts.schedulable) == (None, FactSource.NONE, False)
    assert facts.cgroup_cpu_quota == 2.0
    assert MakeNode("n").unschedulable().manifest()["spec"] == {"unschedulable": True}
    with pytest.raises(ValueError, match="NFD labels only"):
        MakeNode("n").cpu_flags({"AVX2"}, FactSource.PROBE).manifest()


def test_rendered_objects_by_kind_and_name() -> None:
    objs = [{"kind": "Pod", "metadata": {"name": "a-0"}}, {"kind": "Service", "metadata": {
        "name": "a"}}]
    assert list(by_kind_name(objs)) == ["Pod/a-0", "Service/a"]


def test_a_base_renamed_and_moved() -> None:
    base = MakeLocalModel("m", "ns").cpu(2)
    assert base.named("a").manifest()["metadata"] == {"name": "a", "namespace": "ns"}
    assert base.named("b", "other").manifest()["metadata"] == {"name": "b", "namespace": "other"}
    assert base.named("c", None).manifest()["metadata"] == {"name": "c"}


def test_a_registered_node_has_its_uid_and_hostname_from_its_name() -> None:
    node = MakeNode("n0").cpu_flags({"AVX2"}).registered().named("n1")
    meta = node.manifest()["metadata"]
    assert meta["uid"] == "uid-n1"
    assert meta["labels"] == {"kubernetes.io/hostname": "n1",
                              "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
    assert node.facts().labels == {"kubernetes.io/hostname": "n1"}
