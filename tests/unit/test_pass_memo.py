"""What one pass shares by value between alike models and nodes gives exactly
what computing every model on its own gives.

An incremental pass (`incremental.Desired`) evaluates the rules once per
distinct (spec as the rules read it, node facts as the rules read them, CPUs)
(`incremental.Evaluations`), prepares a spec once per such spec, and renders a
pod's containers once per (spec, tuning, options) (`render.PodParts`), whose
JSON text the pod's hash reuses (`render.pod_spec_hash`; both in
render/digests.py). These tests hold each premise (what the keys leave out is
never read) and the whole: a fresh `Desired` equals the plain `desired_state`,
which computes every model with the plain functions and no memo, on worlds
built so that many models and nodes are alike."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localmodel.api import LocalModel, parse_local_model
from localmodel.contract import ANNOTATION_NODE, ANNOTATION_POD_SPEC_HASH, LABEL_REPLICA
from localmodel.desired import desired_state, prepare
from localmodel.facts import FactSource, NodeFacts, Taint
from localmodel.incremental import Desired, Evaluations
from localmodel.planner import Cpus, Usage, cpu_limit, replica_cpus
from localmodel.render import (
    AppliedDigests,
    PodParts,
    RenderOptions,
    ReplicaPlan,
    affinity_text,
    applied_hashes,
    build_containers,
    manifest_hash,
    pod_spec_hash,
    render_objects,
    volumes_text,
)
from localmodel.render import digests as render_digests
from localmodel.rules.evaluate import evaluate, node_key, spec_key
from tests.builders import MakeLocalModel

G = 1 << 30
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLAGS = [None, frozenset({"AVX2"}), frozenset({"AVX2", "AVX512F", "AMXTILE"})]
# Specs as the rules read them; placement, replicas and cpu are varied apart.
BASES: list[dict[str, Any]] = [
    {"model": "qwen3:0.6b"},
    {"model": "qwen3:1.7b", "memory": "6Gi"},
    {"model": "qwen3:1.7b", "memory": "6Gi", "gateway": {"enabled": False}},
    {"model": "gemma3:1b", "context": 4096, "slots": 2, "kvCache": "q8_0"},
    {
        "model": "llama3.2:1b",
        "engine": {"name": "llama-server"},
        "gguf": {"url": "https://example.com/m.gguf", "sha256": "a" * 64},
    },
    {
        "model": "qwen3:0.6b",
        "gguf": {"url": "https://example.com/q.gguf", "sha256": "b" * 64},
        "env": [{"name": "EXTRA", "value": "1"}],
    },
    {"model": "qwen3:0.6b", "engine": {"version": "0.31.0"}},  # AMX guards apply
    {"model": "qwen3:0.6b", "engine": {"version": "0.5.7"}, "placement": {"safeCpuPath": True}},
    {"model": "unknown-model:7b"},  # invalid: memory auto, not in the catalog
    {"model": "unknown-model:7b", "memory": "3Gi", "storage": {"size": "20Gi"}},
]
PLACEMENTS: list[dict[str, Any]] = [
    {},
    {"exclusive": False},
    {"nodeSelector": {"pool": "a"}},
    {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
]


def spec(rnd: random.Random) -> dict[str, Any]:
    base = rnd.choice(BASES)
    placement = {**rnd.choice(PLACEMENTS), **base.get("placement", {})}
    return {
        **base,
        "cpu": rnd.choice([1, 2, 3, "node"]),
        "replicas": rnd.choice([0, 1, 1, 2]),
        "placement": placement,
    }


def local_model(name: str, body: dict[str, Any], namespace: str = "ns") -> LocalModel:
    """A stored LocalModel (its uid from its name) with the spec `body`."""
    return MakeLocalModel(name).namespace(namespace).uid(f"u-{name}").spec(**body).obj()


def cpus(n: NodeFacts, reserved: int) -> Cpus:
    """A replica's CPUs with ``reserved`` taken on ``n``, as the planner decides them."""
    return replica_cpus(cpu_limit(n), reserved)


def random_node(name: str, rnd: random.Random) -> NodeFacts:
    """Nodes of a few shapes, each with its own name and labels."""
    return NodeFacts(
        name=name,
        allocatable_cpu_milli=rnd.choice([2, 4, 8]) * 1000 - rnd.choice([0, 80]),
        allocatable_memory_bytes=rnd.choice([8, 16, 32]) * G,
        labels={"kubernetes.io/hostname": name, **rnd.choice([{}, {"pool": "a"}])},
        taints=rnd.choice([(), (), (Taint("dedicated", "x"),)]),
        cpu_flags=rnd.choice(FLAGS),
        source=rnd.choice([FactSource.NFD, FactSource.PROBE]),
        cgroup_cpu_quota=rnd.choice([None, None, 1.0, 3.0]),
        cpuset_cpus=rnd.choice([None, None, 2]),
    )


def other_placement(body: dict[str, Any], rnd: random.Random) -> dict[str, Any]:
    """The same spec but for what the keys leave out: replicas, cpu, placement
    (but its safeCpuPath)."""
    safe = body["placement"].get("safeCpuPath")
    placement = dict(rnd.choice(PLACEMENTS)) | ({"safeCpuPath": safe} if safe is not None else {})
    return {
        **body,
        "cpu": rnd.choice([1, 4, "node"]),
        "replicas": rnd.choice([0, 3]),
        "placement": placement,
    }


@EXAMPLES
@given(st.randoms(use_true_random=False))
def test_what_the_rules_keys_leave_out_is_never_read(rnd: random.Random) -> None:
    body = spec(rnd)
    a, b = local_model("a", body).spec, local_model("b", other_placement(body, rnd)).spec
    assert spec_key(a) == spec_key(b)
    n1 = random_node("n1", rnd)
    n2 = dataclasses.replace(
        n1,
        name="n2",
        labels={"other": "label"},
        taints=(Taint("t", "v", "NoExecute"),),
        schedulable=not n1.schedulable,
        allocatable_memory_bytes=n1.allocatable_memory_bytes * 2,
    )
    assert node_key(n1) == node_key(n2)
    pa, pb = prepare(a), prepare(b)
    assert (pa.problems, pa.shape, pa.version, pa.memory_bytes) == (
        pb.problems,
        pb.shape,
        pb.version,
        pb.memory_bytes,
    )
    if pa.problems:
        return
    cpu = rnd.choice([1, 2, 5])
    assert evaluate(a, n1, cpus(n1, cpu), pa.shape, pa.version) == evaluate(
        b, n2, cpus(n2, cpu), pb.shape, pb.version
    )


@EXAMPLES
@given(st.randoms(use_true_random=False))
def test_a_pods_containers_read_neither_its_name_nor_its_node(rnd: random.Random) -> None:
    body = spec(rnd)
    a = local_model("a", body)
    b = local_model("bee", other_placement(body, rnd), namespace="other")
    prep = prepare(a.spec)
    if prep.problems:
        return
    n1 = random_node("n1", rnd)
    t = evaluate(a.spec, n1, cpus(n1, 2), prep.shape, prep.version)
    options = RenderOptions(operator_image=rnd.choice(["op:1", "op:2"]))
    ra, rb = ReplicaPlan(0, "n1", t, "x", ""), ReplicaPlan(3, "n9", t, "y", "claim-b")
    assert build_containers(a, ra, options) == build_containers(b, rb, options)


@EXAMPLES
@given(st.randoms(use_true_random=False))
def test_the_pod_hash_from_known_json_is_the_manifest_hash(rnd: random.Random) -> None:
    lm = local_model(rnd.choice(["a", "b-1"]), spec(rnd))
    prep = prepare(lm.spec)
    if prep.problems:
        return
    n1 = random_node("n1", rnd)
    t = evaluate(lm.spec, n1, cpus(n1, 2), prep.shape, prep.version)
    replicas = [ReplicaPlan(r, f"n{r}", t, "", rnd.choice(["", "c"])) for r in range(2)]
    # (With a pass's PodParts: the digest put together from known texts.)
    for o in render_objects(lm, replicas, RenderOptions(), PodParts()):
        if o["kind"] == "Pod":
            spec_ = o["spec"]
            fields = rnd.sample(sorted(spec_), rnd.randrange(len(spec_) + 1))
            known = {k: json.dumps(spec_[k], sort_keys=True) for k in fields}
            assert pod_spec_hash(spec_, known) == manifest_hash(spec_)
            # The affinity's text put together around the node name (render_pod's).
            on = o["metadata"]["annotations"][ANNOTATION_NODE]
            assert affinity_text(on) == json.dumps(spec_["affinity"], sort_keys=True)
            # The volumes' text put together around the claim and ConfigMap names.
            r = replicas[int(o["metadata"]["labels"][LABEL_REPLICA])]
            assert volumes_text(lm, r) == json.dumps(spec_["volumes"], sort_keys=True)
            assert o["metadata"]["annotations"][ANNOTATION_POD_SPEC_HASH] == manifest_hash(spec_)


def test_evaluations_give_one_tuning_per_distinct_input() -> None:
    rnd = random.Random(7)
    lm = local_model("a", {"model": "qwen3:0.6b", "cpu": 2})
    prep = prepare(lm.spec)
    memo = Evaluations()
    n1 = random_node("n1", rnd)
    same_shape = dataclasses.replace(n1, name="n2", labels={})
    other = dataclasses.replace(n1, cgroup_cpu_quota=0.5)
    t1 = memo(lm.spec, n1, cpus(n1, 2), prep.shape, prep.version)
    assert memo(lm.spec, same_shape, cpus(same_shape, 2), prep.shape, prep.version) is t1
    assert memo(lm.spec, other, cpus(other, 2), prep.shape, prep.version) is not t1
    assert memo(lm.spec, n1, cpus(n1, 1), prep.shape, prep.version) is not t1
    assert memo(lm.spec, other, cpus(other, 2), prep.shape, prep.version) == evaluate(
        lm.spec, other, cpus(other, 2), prep.shape, prep.version
    )


# ---- the whole pass: the incremental layer against the plain path ------------


@EXAMPLES
@given(st.randoms(use_true_random=False))
def test_a_pass_sharing_work_between_alike_models_equals_each_model_on_its_own(
    rnd: random.Random,
) -> None:
    nodes = [random_node(f"n{i}", rnd) for i in range(rnd.randrange(1, 12))]
    models = [local_model(f"m{i}", spec(rnd)) for i in range(rnd.randrange(1, 16))]
    current = {
        lm.key: [rnd.choice([None, *(n.name for n in nodes)]) for _ in range(2)]
        for lm in models
        if rnd.random() < 0.3
    }
    usage = {n.name: Usage(rnd.randrange(1500), rnd.randrange(3) * G) for n in nodes}
    ready = {lm.key: {0: rnd.random() < 0.5} for lm in models}
    options = RenderOptions(operator_image=rnd.choice(["op:1", "op:2"]))
    args: dict[str, Any] = dict(
        now="2026-01-01T00:00:00Z", current=current, usage=usage, ready=ready, options=options
    )
    got, want = Desired().state(models, nodes, **args), desired_state(models, nodes, **args)
    assert got.plan == want.plan
    for g, w in zip(got.models, want.models, strict=True):
        assert g == w, g.model.key
        assert g.objects == w.objects, g.model.key


def _with_metadata(lm: LocalModel, **meta: Any) -> LocalModel:
    body = lm.model_dump(by_alias=True, exclude_none=True)
    body["metadata"] = {**body["metadata"], **meta}
    return parse_local_model(body)


@EXAMPLES
@given(st.randoms(use_true_random=False))
def test_applied_digests_from_a_shared_template_are_the_manifest_hashes(
    rnd: random.Random,
) -> None:
    """Premise of `AppliedDigests`: of a model's metadata, its applied objects
    read its name, namespace and uid only (a template made from one model
    serves another whose labels, annotations and generation differ), and a
    uid may hold characters JSON escapes."""
    body = spec(rnd)
    first = local_model("a", body)
    prep = prepare(first.spec)
    if prep.problems:
        return
    n1 = random_node("n1", rnd)
    t = evaluate(first.spec, n1, cpus(n1, 2), prep.shape, prep.version)
    replicas = [ReplicaPlan(r, f"n{r}", t, "", "") for r in range(rnd.randrange(3))]
    other = _with_metadata(
        local_model(rnd.choice(["b", "b-2", "zz"]), body, rnd.choice(["ns", "other"])),
        labels={"team": "x"}, annotations={"a": "\"quoted\" é"}, generation=7,
        uid=rnd.choice(["u-b", "u-\u00e9\"\\"]),
    )
    digests = AppliedDigests()
    for lm in (first, other):
        assert digests(lm, replicas) == applied_hashes(lm, replicas), lm.metadata.name
    assert all(v is not None for v in digests._seen.values()), "a template was not used"


def test_applied_digests_fall_back_to_the_plain_ones_when_a_template_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rnd = random.Random(3)
    lm, wrong = local_model("a", BASES[0]), local_model("zz", BASES[2])
    prep = prepare(lm.spec)
    n1 = random_node("n1", rnd)
    t = evaluate(lm.spec, n1, cpus(n1, 2), prep.shape, prep.version)
    replicas = [ReplicaPlan(0, "n0", t, "", "")]
    made_from = render_digests._applied_templates
    monkeypatch.setattr(render_digests, "_applied_templates",
                        lambda _, rs, opts: made_from(wrong, rs, opts))
    digests = AppliedDigests()
    other = local_model("b", BASES[0])
    for model in (lm, other):  # the first makes (and rejects) the template, the second uses none
        assert digests(model, replicas) == applied_hashes(model, replicas)
    assert list(digests._seen.values()) == [None]
