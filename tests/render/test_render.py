"""The renderer and the desired-state pipeline: tables and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.api import LocalModel
from localmodel.desired import desired_state
from localmodel.engines import ollama
from localmodel.engines.ollama import AMX_LIBRARY
from localmodel.facts import NodeFacts, Taint
from localmodel.facts.quantity import parse_bytes, parse_cpu_milli
from localmodel.render import RenderOptions, manifest_hash
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

GiB = 1024**3
NOW = "2026-11-29T00:00:00Z"
AMX = frozenset({"AMXTILE", "AMXBF16", "AMXINT8", "AVX512F", "AVX2"})
AVX2 = frozenset({"AVX2"})


QWEN = MakeLocalModel("qwen3").generation(3)
NODE = MakeNode("n1").cpu_flags(AVX2)


def objects(model: LocalModel, nodes: list[NodeFacts] | None = None,
            options: RenderOptions | None = None) -> dict[str, dict[str, Any]]:
    state = desired_state([model], nodes or [NODE.facts()], now=NOW, options=options)
    return by_kind_name(state.models[0].objects)


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_one_replica_renders_pod_claim_service_and_modelfile() -> None:
    objs = objects(QWEN.spec(cpu=4).obj())
    assert set(objs) == {
        "ConfigMap/qwen3-modelfile",
        "PersistentVolumeClaim/qwen3-weights-0",
        "Pod/qwen3-0",
        "Service/qwen3",
    }
    pod = objs["Pod/qwen3-0"]
    assert pod["metadata"]["labels"]["localmodel.dev/name"] == "qwen3"
    assert pod["metadata"]["annotations"]["localmodel.dev/node"] == "n1"
    assert pod["metadata"]["annotations"]["localmodel.dev/threads"] == "4"
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n1"]
    c = containers(pod)
    assert set(c) == {"pull", "ollama", "gateway"}
    # The engine only reads its home; the pull step writes it.
    assert {"name": "weights", "mountPath": "/root/.ollama", "readOnly": True} in c["ollama"][
        "volumeMounts"]
    assert {"name": "weights", "mountPath": "/root/.ollama"} in c["pull"]["volumeMounts"]
    assert env(c["ollama"])["GOMAXPROCS"] == "4"
    assert env(c["gateway"])["LOCALMODEL_GATEWAY_THREADS"] == "4"
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "qwen3-weights-0"
    modelfile = objs["ConfigMap/qwen3-modelfile"]["data"]["replica-0.Modelfile"]
    assert modelfile.splitlines() == [
        "FROM qwen3:1.7b",
        "PARAMETER num_batch 512",
        "PARAMETER num_ctx 8192",
        "PARAMETER num_thread 4",
    ]
    svc = objs["Service/qwen3"]["spec"]
    assert svc["selector"] == {"localmodel.dev/name": "qwen3"}
    assert svc["ports"][0]["targetPort"] == "http"


def test_init_step_pulls_only_when_weights_are_missing() -> None:
    script = containers(objects(QWEN.obj())["Pod/qwen3-0"])["pull"]["command"][2]
    show, pull, create = (
        script.index(s)
        for s in ("ollama show qwen3:1.7b", "ollama pull qwen3:1.7b", "ollama create")
    )
    assert show < pull < create
    assert "else\n  ollama pull" in script  # the pull sits in the else branch of the check


def test_owner_references_and_retained_weights() -> None:
    objs = objects(QWEN.uid("u-1").obj())
    assert objs["Pod/qwen3-0"]["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert objs["Service/qwen3"]["metadata"]["ownerReferences"][0]["kind"] == "LocalModel"
    assert "ownerReferences" not in objs["PersistentVolumeClaim/qwen3-weights-0"]["metadata"]
    gone = objects(QWEN.uid("u-1").spec(storage={"retain": False}).obj())
    assert "ownerReferences" in gone["PersistentVolumeClaim/qwen3-weights-0"]["metadata"]
    offline = objects(QWEN.obj())["Pod/qwen3-0"]
    assert "ownerReferences" not in offline["metadata"]  # offline: no uid


def test_amx_guard_removes_the_library_before_the_engine_starts() -> None:
    objs = objects(QWEN.spec(engine={"version": "0.31.0"}).obj(), [NODE.cpu_flags(AMX).facts()])
    c = containers(objs["Pod/qwen3-0"])
    assert c["ollama"]["command"][2].startswith(f"rm -f {AMX_LIBRARY}; exec")
    assert f"rm -f {AMX_LIBRARY}" in c["pull"]["command"][2]
    # The variant is the crash in 0.30-0.32.1; flash attention stays as specified.
    assert "OLLAMA_FLASH_ATTENTION" not in env(c["ollama"])
    plain = containers(objects(QWEN.obj(), [NODE.cpu_flags(AMX).facts()])["Pod/qwen3-0"])
    assert plain["ollama"]["args"] == ["serve"] and "command" not in plain["ollama"]


def test_gateway_disabled_exposes_the_engine() -> None:
    objs = objects(QWEN.spec(gateway={"enabled": False}).obj())
    c = containers(objs["Pod/qwen3-0"])
    assert "gateway" not in c
    assert env(c["ollama"])["OLLAMA_HOST"] == f"0.0.0.0:{ollama.PORT}"
    assert objs["Service/qwen3"]["spec"]["ports"][0]["targetPort"] == "engine"


def test_user_env_placement_and_storage_are_carried() -> None:
    model = QWEN.spec(
        env=[{"name": "OLLAMA_DEBUG", "value": "1"}],
        placement={
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "ai", "operator": "Exists"}],
        },
        storage={"size": "30Gi", "storageClassName": "local"},
    ).obj()
    n = NODE.labels(pool="a").taints(Taint("ai", "", "NoSchedule")).facts()
    objs = objects(model, [n])
    pod = objs["Pod/qwen3-0"]
    assert env(containers(pod)["ollama"])["OLLAMA_DEBUG"] == "1"
    assert pod["spec"]["nodeSelector"] == {"pool": "a"}
    assert pod["spec"]["tolerations"] == [{"key": "ai", "operator": "Exists"}]
    pvc = objs["PersistentVolumeClaim/qwen3-weights-0"]["spec"]
    assert pvc["storageClassName"] == "local"
    assert pvc["resources"]["requests"]["storage"] == "30Gi"


def test_status_explains_placement_and_decisions() -> None:
    state = desired_state([QWEN.spec(cpu=4, replicas=2).obj()],
                          [NODE.named("a").facts(), NODE.named("b").facts()], now=NOW)
    status = state.models[0].status
    cond = {c.type: c for c in status.conditions}
    assert cond["Valid"].status.value == "True"
    assert cond["Placed"].status.value == "True" and "2/2" in cond["Placed"].message
    assert cond["Ready"].status.value == "Unknown"
    assert all(c.observed_generation == 3 for c in status.conditions)
    assert {p.node for p in status.placements} == {"a", "b"}
    assert status.placements[0].settings["OLLAMA_NUM_PARALLEL"] == "1"
    assert "threads-from-cpu-limit" in [d.rule for d in status.placements[0].decisions]
    assert status.endpoint == f"http://qwen3.ai.svc:{ollama.PORT}"


def test_nothing_fits_says_why_per_node() -> None:
    state = desired_state([QWEN.spec(cpu=8).obj()], [NODE.named("tiny").cpus(2).facts()], now=NOW)
    r = state.models[0]
    placed = next(c for c in r.status.conditions if c.type == "Placed")
    assert placed.status.value == "False"
    assert "tiny" in placed.message
    assert not [o for o in r.objects if o["kind"] == "Pod"]


def test_invalid_model_gets_valid_false_and_no_objects() -> None:
    state = desired_state([QWEN.spec(model="acme/unknown:1b").obj()], [NODE.facts()], now=NOW)
    r = state.models[0]
    valid = next(c for c in r.status.conditions if c.type == "Valid")
    assert valid.status.value == "False" and "modelInfo" in valid.message
    assert r.objects == ()


def test_ready_condition_from_observed_pods_and_stable_transition_time() -> None:
    model = QWEN.spec(cpu=4).obj()
    first = desired_state([model], [NODE.facts()], now=NOW, ready={"ai/qwen3": {0: False}})
    ready = next(c for c in first.models[0].status.conditions if c.type == "Ready")
    assert (ready.status.value, ready.reason) == ("False", "ReplicasNotReady")
    again = desired_state(
        [first.models[0].with_status],
        [NODE.facts()],
        now="2027-01-01T00:00:00Z",
        ready={"ai/qwen3": {0: False}},
    )
    ready2 = next(c for c in again.models[0].status.conditions if c.type == "Ready")
    assert ready2.last_transition_time == NOW  # status unchanged: time unchanged
    up = desired_state(
        [first.models[0].with_status],
        [NODE.facts()],
        now="2027-01-01T00:00:00Z",
        ready={"ai/qwen3": {0: True}},
    )
    ready3 = next(c for c in up.models[0].status.conditions if c.type == "Ready")
    assert (ready3.status.value, ready3.last_transition_time) == ("True", "2027-01-01T00:00:00Z")
    assert up.models[0].status.ready == "1/1"


# The pod-spec hash is how the operator tells a stale pod: a refactor of the
# renderer must not change it (or every pod in every cluster restarts).
# Changed on purpose when the pinned image moved to 0.34.4 (with 0.32.2 pinned
# the default case is still a1457014dfe61b18) and the AMX guard stopped turning
# flash attention off for 0.30-0.32.1 (docs/engine-facts.md#amx), and when
# the init step began stopping its `ollama serve` on every exit path (a trap:
# a failed pull left the server running; issue 17), and when every engine got
# its prompt cache's bound (LLAMA_ARG_CACHE_RAM / --cache-ram) and memory its
# prompt-cache term (issue 30), and when model pods were
# hardened (issue 30: no ServiceAccount token, seccomp, no capabilities, the
# engine's weights mount read-only; docs/security.md), and when the gateway
# gained its admin port (8090: /metrics, /speed, /ledger; issue 30), and when
# every container got `terminationMessagePolicy: FallbackToLogsOnError` (a
# failing container's last words reach the model's status; issue 42), and when
# memory became the engines' own allocation (compute and sliding-window KV
# from the model's shape, issue 45: every memory limit moved; then the
# context checkpoints, rendered and counted). Rendered
# with the operator image of 0.1.0 (PINNED_OPERATOR_IMAGE), so a new version's
# image tag (which does roll every pod, on purpose) does not move the pins.
PINNED_OPERATOR_IMAGE = "ghcr.io/localmodel/localmodel-operator:0.1.0"
PINNED_POD_SPEC_HASHES: list[tuple[str, dict[str, Any], list[NodeFacts] | None, str]] = [
    ("default", {"cpu": 4}, None, "8e467b94647415c0"),
    ("no gateway", {"gateway": {"enabled": False}}, None, "afc9885e76033dba"),
    (
        "AMX guard",
        {"engine": {"version": "0.31.0"}},
        [NODE.cpu_flags(AMX).facts()],
        "75927fe01edf7609",
    ),
    (
        "env, placement, storage",
        {
            "env": [{"name": "OLLAMA_DEBUG", "value": "1"}],
            "placement": {
                "nodeSelector": {"pool": "a"},
                "tolerations": [{"key": "ai", "operator": "Exists"}],
            },
            "storage": {"size": "30Gi", "storageClassName": "local"},
        },
        [NODE.labels(pool="a").taints(Taint("ai", "", "NoSchedule")).facts()],
        "6e59aa39842d0fd7",
    ),
]


@pytest.mark.parametrize(("case", "spec", "ns", "digest"), PINNED_POD_SPEC_HASHES)
def test_pod_spec_hash_is_stable(
    case: str, spec: dict[str, Any], ns: list[NodeFacts] | None, digest: str
) -> None:
    options = RenderOptions(PINNED_OPERATOR_IMAGE)
    pod = objects(QWEN.spec(**spec).obj(), ns, options)["Pod/qwen3-0"]
    assert pod["metadata"]["annotations"]["localmodel.dev/pod-spec-hash"] == digest, case
    assert manifest_hash(pod["spec"]) == digest


def test_containers_share_no_objects() -> None:
    """Each builder returns fresh objects: changing one container never changes
    another (and YAML output carries no anchors)."""
    pod = objects(QWEN.spec(cpu=4).obj())["Pod/qwen3-0"]
    c = containers(pod)
    c["pull"]["resources"]["limits"]["cpu"] = "99"
    c["pull"]["volumeMounts"].clear()
    assert c["ollama"]["resources"]["limits"]["cpu"] == "4"
    assert len(c["ollama"]["volumeMounts"]) == 2


# --- properties -----------------------------------------------------------

flags = st.sampled_from([None, AMX, AVX2, frozenset()])
versions = st.sampled_from(
    [None, "0.12.0", "0.24.0", "0.30.0", "0.31.5", "0.32.1", "0.32.2", "1.0"]
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    kv = draw(st.sampled_from(["f16", "q8_0", "q4_0"]))
    fa = draw(st.sampled_from(["auto", "enabled"] + (["disabled"] if kv == "f16" else [])))
    spec: dict[str, Any] = {
        "cpu": draw(st.one_of(st.integers(1, 40), st.just("node"))),
        "context": draw(st.integers(512, 65536)),
        "slots": draw(st.integers(1, 4)),
        "kvCache": kv,
        "flashAttention": fa,
        "replicas": draw(st.integers(0, 3)),
        "model": draw(st.sampled_from(["qwen3:1.7b", "gemma3:270m", "llama3.2:1b", "qwen3"])),
        "placement": {"safeCpuPath": draw(st.booleans())},
        "gateway": {"enabled": draw(st.booleans())},
    }
    v = draw(versions)
    if v:
        spec["engine"] = {"version": v}
    return spec


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeFacts]:
    n = draw(st.integers(1, 5))
    return [
        MakeNode(f"n{i}")
        .cpus(draw(st.integers(1, 64)))
        .memory_gib(draw(st.integers(2, 256)))
        .cpu_flags(draw(flags))
        .with_facts(cpuset_cpus=draw(st.one_of(st.none(), st.integers(1, 64))))
        .facts()
        for i in range(n)
    ]


@settings(max_examples=150, deadline=None)
@given(specs(), nodes())
def test_rendered_pods_are_guaranteed_and_never_oversubscribe(
    spec: dict[str, Any], ns: list[NodeFacts]
) -> None:
    state = desired_state([QWEN.spec(**spec).obj()], ns, now=NOW)
    by_name = {n.name: n for n in ns}
    for obj in state.models[0].objects:
        if obj["kind"] != "Pod":
            continue
        n = by_name[obj["metadata"]["annotations"]["localmodel.dev/node"]]
        threads = int(obj["metadata"]["annotations"]["localmodel.dev/threads"])
        cs = containers(obj)
        engine_cpu = parse_cpu_milli(cs["ollama"]["resources"]["limits"]["cpu"])
        # threads never exceed the CPU limit, the node, or the cpuset
        assert engine_cpu % 1000 == 0 and threads <= engine_cpu // 1000
        assert threads <= n.allocatable_cpus
        assert n.cpuset_cpus is None or threads <= n.cpuset_cpus
        assert env(cs["ollama"])["GOMAXPROCS"] == str(threads)
        # every container is Guaranteed: requests == limits, cpu and memory set
        for c in cs.values():
            r = c["resources"]
            assert r["requests"] == r["limits"] and set(r["limits"]) == {"cpu", "memory"}
        # a quantized KV cache never meets flash attention off
        e = env(cs["ollama"])
        if e.get("OLLAMA_FLASH_ATTENTION") == "0":
            assert e["OLLAMA_KV_CACHE_TYPE"] == "f16"
        # memory: the pod fits the node
        total = sum(
            parse_bytes(c["resources"]["limits"]["memory"]) for c in obj["spec"]["containers"]
        )
        assert total <= n.allocatable_memory_bytes


def test_gateway_accepts_exactly_the_environment_the_renderer_sets() -> None:
    from localmodel.gateway.config import parse_config

    model = QWEN.spec(
        cpu=6,
        slots=2,
        context=4096,
        gateway={"maxQueue": 3, "deadlineSeconds": 90, "maxTokens": 500},
    ).obj()
    pod = objects(model)["Pod/qwen3-0"]
    gw = containers(pod)["gateway"]
    config = parse_config([], env(gw))
    assert config.threads == 6 and config.slots == 2 and config.context == 4096
    assert (config.max_queue, config.deadline, config.max_tokens) == (3, 90, 500)
    assert config.model == "qwen3:1.7b"
    assert config.upstream.startswith(f"http://127.0.0.1:{ollama.PORT}")
    port = next(p["containerPort"] for p in gw["ports"] if p["name"] == "http")
    assert config.listen_port == port
    assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_overflow_settings_and_the_secret_reach_the_gateway_container() -> None:
    from localmodel.gateway.config import parse_config
    from localmodel.gateway_contract import OVERFLOW_API_KEY_ENV

    overflow = {
        "url": "https://api.example.com/v1",
        "model": "gpt-4o-mini",
        "apiKeySecretRef": {"name": "llm-keys", "key": "openai"},
        "after": 1.5,
    }
    pod = objects(QWEN.spec(gateway={"overflow": overflow}).obj())["Pod/qwen3-0"]
    gw = containers(pod)["gateway"]
    secret = [e for e in gw["env"] if "valueFrom" in e]
    assert secret == [
        {
            "name": OVERFLOW_API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": "llm-keys", "key": "openai"}},
        }
    ]
    plain = {e["name"]: e["value"] for e in gw["env"] if "value" in e}
    config = parse_config([], plain | {OVERFLOW_API_KEY_ENV: "sk-from-the-secret"})
    assert (config.overflow_url, config.overflow_model, config.overflow_after) == (
        "https://api.example.com/v1",
        "gpt-4o-mini",
        1.5,
    )
    assert config.overflow_api_key == "sk-from-the-secret"
    # Without overflow the gateway gets no overflow variables at all.
    plain_pod = objects(QWEN.obj())["Pod/qwen3-0"]
    names = [e["name"] for e in containers(plain_pod)["gateway"]["env"]]
    assert not [n for n in names if "OVERFLOW" in n]


def test_status_carries_the_scale_subresources_replicas_and_selector() -> None:
    state = desired_state([QWEN.spec(replicas=2).obj()],
                          [NODE.facts(), NODE.named("n2").facts()], now=NOW)
    status = state.models[0].status
    assert (status.replicas, status.selector) == (2, "localmodel.dev/name=qwen3")
    pods = [o for o in state.models[0].objects if o["kind"] == "Pod"]
    key, value = status.selector.split("=")
    assert all(p["metadata"]["labels"][key] == value for p in pods)
