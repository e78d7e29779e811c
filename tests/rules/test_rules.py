"""Every rule: a case where it fires and a case where it does not."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.api import FlashAttention, KVCacheType, LocalModelSpec
from localmodel.catalog import CATALOG, lookup, normalize
from localmodel.engines import ollama
from localmodel.engines.ollama import AMX_LIBRARY
from localmodel.facts import NodeFacts
from localmodel.planner import cpu_limit, replica_cpus
from localmodel.rules.evaluate import evaluate, problems, tune
from localmodel.rules.memory import kv_cache_bytes, memory_decision
from localmodel.rules.model import Tuning, VersionRange
from localmodel.rules.table import RULES, RULES_BY_ID, SHIPPED_RULES
from localmodel.versions import image_version, parse_version
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

GiB = 1024**3
MiB = 1024**2
AMX = frozenset({"AMXTILE", "AMXINT8", "AMXBF16", "AVX512F", "AVX2"})
AVX2 = frozenset({"AVX2", "AVX", "FMA3"})


NODE = MakeNode("n1").cpus(32).memory_gib(128).cpu_flags(AVX2)
AVX2_NODE = NODE.facts()
AMX_NODE = NODE.cpu_flags(AMX).facts()
UNKNOWN_NODE = NODE.cpu_flags(None).facts()  # no NFD, no probe


def spec(**kw: Any) -> LocalModelSpec:
    """A LocalModel's spec, parsed as the operator parses the object."""
    return MakeLocalModel("m").spec(**kw).obj().spec


def run(s: LocalModelSpec, n: NodeFacts | None = None, cpu: int = 4) -> Tuning:
    return tune(s, n or AVX2_NODE, cpu)


def fired(t: Tuning) -> set[str]:
    return {d.rule for d in t.decisions}


SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
LLAMA: dict[str, Any] = {
    "model": "gemma3:270m",
    "engine": {"name": "llama-server"},
    "gguf": {"url": "https://h/gemma-3-270m-q4_k_m.gguf", "sha256": SHA},
}
NO_GATEWAY = {"gateway": {"enabled": False}}

# (rule id, spec, node, cpu, expected: does it fire?)
CASES: list[tuple[str, dict[str, Any], NodeFacts, int, bool]] = [
    ("threads-from-cpu-limit", LLAMA, AVX2_NODE, 2, True),
    ("threads-capped-by-node", LLAMA, NODE.with_facts(cpuset_cpus=2).facts(), 4, True),
    ("one-model-per-pod", LLAMA, AVX2_NODE, 4, False),
    ("llama-server-context-per-slot", LLAMA, AVX2_NODE, 4, True),
    ("llama-server-context-per-slot", {}, AVX2_NODE, 4, False),
    ("kv-cache-quantized-enables-flash-attention", LLAMA | {"kvCache": "q8_0"}, AVX2_NODE, 4, True),
    (
        "amx-guard",
        LLAMA | {"engine": {"name": "llama-server", "version": "0.31.0"}},
        AMX_NODE,
        4,
        False,
    ),
    ("amx-remove-cpu-variant", LLAMA, UNKNOWN_NODE, 4, False),
    ("memory-from-weights-and-kv", LLAMA, AVX2_NODE, 4, True),
    ("prompt-cache-bounded", LLAMA, AVX2_NODE, 4, True),
    ("prompt-cache-bounded", {}, AVX2_NODE, 4, True),
    ("context-checkpoints-bounded", LLAMA, AVX2_NODE, 4, True),
    ("context-checkpoints-bounded", {}, AVX2_NODE, 4, True),
    ("weights-volume", LLAMA, AVX2_NODE, 4, True),
    ("llama-server-metrics", LLAMA, AVX2_NODE, 4, True),
    ("llama-server-metrics", {}, AVX2_NODE, 4, False),
    ("llama-server-no-webui", LLAMA, AVX2_NODE, 4, True),
    ("llama-server-no-webui", {}, AVX2_NODE, 4, False),
    ("llama-server-private-slots", LLAMA | NO_GATEWAY, AVX2_NODE, 4, True),
    ("llama-server-private-slots", LLAMA, AVX2_NODE, 4, False),
    ("llama-server-private-slots", NO_GATEWAY, AVX2_NODE, 4, False),
    ("llama-server-startup-from-load-time", LLAMA, AVX2_NODE, 4, True),
    ("llama-server-startup-from-load-time", {}, AVX2_NODE, 4, False),
    ("threads-from-cpu-limit", {}, AVX2_NODE, 4, True),
    ("threads-from-cpu-limit", {"engine": {"name": "ollama"}}, AVX2_NODE, 1, True),
    ("threads-capped-by-node", {}, NODE.with_facts(cpuset_cpus=2).facts(), 4, True),
    ("threads-capped-by-node", {}, NODE.with_facts(cgroup_cpu_quota=1.5).facts(), 4, True),
    ("threads-capped-by-node", {}, NODE.with_facts(cpuset_cpus=8).facts(), 4, False),
    ("one-model-per-pod", {}, AVX2_NODE, 4, True),
    ("kv-cache-quantized-enables-flash-attention", {"kvCache": "q8_0"}, AVX2_NODE, 4, True),
    ("kv-cache-quantized-enables-flash-attention", {"kvCache": "f16"}, AVX2_NODE, 4, False),
    (
        "kv-cache-quantized-enables-flash-attention",
        {"kvCache": "q4_0", "flashAttention": "enabled"},
        AVX2_NODE,
        4,
        False,
    ),
    ("amx-guard", {"engine": {"version": "0.24.0"}}, AMX_NODE, 4, True),
    ("amx-guard", {"engine": {"image": "ollama/ollama:latest"}}, AMX_NODE, 4, True),
    ("amx-guard", {"engine": {"version": "0.20.0"}}, UNKNOWN_NODE, 4, True),
    ("amx-guard", {"engine": {"version": "0.31.0"}}, AMX_NODE, 4, False),
    ("amx-guard", {"engine": {"version": "0.32.2"}}, AMX_NODE, 4, False),
    ("amx-guard", {"engine": {"version": "0.24.0"}}, AVX2_NODE, 4, False),
    ("amx-remove-cpu-variant", {"engine": {"version": "0.30.0"}}, AMX_NODE, 4, True),
    ("amx-remove-cpu-variant", {"engine": {"version": "0.32.1"}}, AMX_NODE, 4, True),
    ("amx-remove-cpu-variant", {"engine": {"version": "0.24.0"}}, AMX_NODE, 4, False),
    ("amx-remove-cpu-variant", {"engine": {"version": "0.33.0"}}, AMX_NODE, 4, False),
    ("amx-safe-path-forced", {"placement": {"safeCpuPath": True}}, AMX_NODE, 4, True),
    ("amx-safe-path-forced", {"placement": {"safeCpuPath": True}}, AVX2_NODE, 4, False),
    ("amx-safe-path-forced", {}, AMX_NODE, 4, False),
    (
        "kv-cache-falls-back-to-f16",
        {"kvCache": "q8_0", "engine": {"version": "0.24.0"}},
        AMX_NODE,
        4,
        True,
    ),
    ("kv-cache-falls-back-to-f16", {"kvCache": "q8_0"}, AMX_NODE, 4, False),
    ("memory-from-weights-and-kv", {}, AVX2_NODE, 4, True),
    ("memory-from-weights-and-kv", {"memory": "8Gi"}, AVX2_NODE, 4, False),
    ("memory-from-spec", {"memory": "8Gi"}, AVX2_NODE, 4, True),
    ("memory-from-spec", {}, AVX2_NODE, 4, False),
    ("guaranteed-qos", {}, AVX2_NODE, 4, True),
    ("weights-volume", {}, AVX2_NODE, 4, True),
    ("ollama-micro-batch-pinned", {"context": 32768, "slots": 2}, AVX2_NODE, 4, True),
    ("ollama-micro-batch-pinned", LLAMA, AVX2_NODE, 4, False),
]


def test_every_rule_has_a_positive_and_a_negative_or_always_case() -> None:
    always = {"threads-from-cpu-limit", "one-model-per-pod", "guaranteed-qos", "weights-volume",
              "prompt-cache-bounded", "context-checkpoints-bounded"}
    for rule in SHIPPED_RULES:  # a test-only engine's: tests/conformance/
        outcomes = {fires for rid, *_, fires in CASES if rid == rule.id}
        assert True in outcomes, f"{rule.id} has no positive case"
        assert False in outcomes or rule.id in always, f"{rule.id} has no negative case"


@pytest.mark.parametrize(("rule", "spec_kw", "n", "cpu", "fires"), CASES)
def test_rule_fires_exactly_when_it_should(
    rule: str, spec_kw: dict[str, Any], n: NodeFacts, cpu: int, fires: bool
) -> None:
    assert (rule in fired(run(spec(**spec_kw), n, cpu))) is fires


def test_every_rule_carries_a_reason_and_source() -> None:
    for r in RULES:
        assert r.reason and r.source and r.effect and r.title, r.id
    assert len(RULES_BY_ID) == len(RULES)


def test_threads_equal_cpu_limit_in_modelfile_and_gomaxprocs() -> None:
    t = run(spec(), AVX2_NODE, cpu=6)
    assert (t.threads, t.cpu) == (6, 6)
    assert t.env["GOMAXPROCS"] == "6"
    assert t.modelfile["num_thread"] == "6"


def test_threads_never_exceed_the_cpuset_or_quota() -> None:
    t = run(spec(), NODE.with_facts(cpuset_cpus=2, cgroup_cpu_quota=3.0).facts(), cpu=8)
    assert (t.threads, t.cpu, t.env["GOMAXPROCS"]) == (2, 2, "2")
    t = run(spec(), NODE.with_facts(cgroup_cpu_quota=1.5).facts(), cpu=8)
    assert t.threads == 1  # rounded down, never up


def test_ollamas_micro_batch_is_the_one_the_memory_decision_counts() -> None:
    # Ollama 0.34 would pick 1024 above 4096 tokens of context and 2048 above 32768
    # (ollama server/sched.go generationBatchForContext); the formula counts UBATCH.
    from localmodel.rules.model import UBATCH

    for context, slots in ((2048, 1), (8192, 1), (32768, 4)):
        t = run(spec(context=context, slots=slots))
        assert t.modelfile["num_batch"] == str(UBATCH) == "512", (context, slots)
    assert "num_batch" not in run(spec(**LLAMA)).modelfile


def test_one_model_per_pod_environment() -> None:
    t = run(spec(slots=2, context=4096, keepAlive="30m"))
    assert t.env["OLLAMA_MAX_LOADED_MODELS"] == "1"
    assert t.env["OLLAMA_NUM_PARALLEL"] == "2"
    assert t.env["OLLAMA_CONTEXT_LENGTH"] == "4096"
    assert t.env["OLLAMA_KEEP_ALIVE"] == "30m"
    assert t.env["OLLAMA_MODELS"].startswith("/root/.ollama")
    assert t.env["OLLAMA_HOST"] == f"127.0.0.1:{ollama.PORT}"
    assert run(spec(gateway={"enabled": False})).env["OLLAMA_HOST"] == f"0.0.0.0:{ollama.PORT}"


def test_quantized_cache_turns_flash_attention_on_explicitly() -> None:
    t = run(spec(kvCache="q4_0"))
    assert t.flash_attention is FlashAttention.ENABLED
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "1"
    assert t.env["OLLAMA_KV_CACHE_TYPE"] == "q4_0"
    assert "OLLAMA_FLASH_ATTENTION" not in run(spec()).env  # auto leaves it to the engine


def test_amx_guard_overrides_explicit_flash_attention_and_falls_back_the_cache() -> None:
    t = run(spec(kvCache="q8_0", flashAttention="enabled", engine={"version": "0.24.0"}), AMX_NODE)
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "0"
    assert t.kv_cache is KVCacheType.F16 and t.env["OLLAMA_KV_CACHE_TYPE"] == "f16"
    assert any("fell back to f16" in w for w in t.warnings)
    fallback = next(d for d in t.decisions if d.rule == "kv-cache-falls-back-to-f16")
    assert "q8_0 -> f16" in fallback.effect


def test_amx_guard_before_0_30_does_not_delete_the_library() -> None:
    t = run(spec(engine={"version": "0.24.0"}), AMX_NODE)
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "0"
    assert t.remove_libraries == ()


@pytest.mark.parametrize(("version", "chooses_runner"), [("0.5.7", True), ("0.5.12", False),
                                                         ("0.24.0", False), (None, True)])
def test_cpu_avx2_only_where_ollama_llm_library_chooses_a_cpu_runner(
    version: str | None, chooses_runner: bool
) -> None:
    """OLLAMA_LLM_LIBRARY picks a CPU runner only before 0.5.12; later it only
    filters GPU folders, so cpu_avx2 is not presented as a fix there
    (docs/engine-facts.md#ollama_llm_library). Unknown: the safe side."""
    engine = {"version": version} if version else {"image": "ollama/ollama:latest"}
    t = run(spec(engine=engine), AMX_NODE)
    assert ("OLLAMA_LLM_LIBRARY" in t.env) is chooses_runner
    guard = next(d for d in t.decisions if d.rule == "amx-guard")
    assert ("cpu_avx2" in guard.effect) is chooses_runner


@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.32.1"])
def test_amx_affected_variant_is_removed_and_flash_attention_stays(version: str) -> None:
    """0.30.0-0.32.1: the sapphirerapids library is the crash; deleting it is the
    fix, and OLLAMA_LLM_LIBRARY would not choose a CPU variant anyway."""
    t = run(spec(kvCache="q8_0", engine={"version": version}), AMX_NODE)
    assert AMX_LIBRARY in t.remove_libraries
    assert "OLLAMA_LLM_LIBRARY" not in t.env
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "1"
    assert t.kv_cache is KVCacheType.Q8_0


def test_fixed_version_on_amx_keeps_flash_attention_and_the_library() -> None:
    t = run(spec(kvCache="q8_0"), AMX_NODE)  # default image 0.34.4
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "1"
    assert "OLLAMA_LLM_LIBRARY" not in t.env
    assert t.remove_libraries == ()


def test_unknown_features_or_version_take_the_safe_side_and_say_so() -> None:
    t = run(spec(engine={"image": "ollama/ollama:latest"}), UNKNOWN_NODE)
    guard = next(d for d in t.decisions if d.rule == "amx-guard")
    assert "CPU features unknown" in guard.effect and "engine version unknown" in guard.effect


def test_forced_safe_path_on_fixed_version() -> None:
    t = run(spec(placement={"safeCpuPath": True}), AMX_NODE)
    assert t.env["OLLAMA_FLASH_ATTENTION"] == "0"
    assert "OLLAMA_LLM_LIBRARY" not in t.env  # does nothing on CPU in 0.34.4
    assert AMX_LIBRARY in t.remove_libraries


def test_memory_is_the_sum_of_the_decisions_parts() -> None:
    t = run(spec(context=2048))
    shape = CATALOG["qwen3:1.7b"]
    kv = 224 * MiB  # docs/engine-facts.md: Qwen3-1.7B f16 at 2048 ctx = 224 MiB exactly
    assert t.memory_parts["kvCache"] == kv
    budget = memory_decision(shape, context=2048, slots=1, kv_cache=KVCacheType.F16,
                             flash_attention=True, prompt_cache_bytes=kv // 4)
    assert t.memory_parts == budget.parts()
    assert t.memory_bytes == budget.total == shape.weights_bytes + kv + kv // 4 + (
        budget.compute + budget.runtime)


@pytest.mark.parametrize(("kv", "ratio"), [("q8_0", (34, 64)), ("q4_0", (18, 64))])
def test_quantized_cache_shrinks_memory_by_its_element_size(
    kv: str, ratio: tuple[int, int]
) -> None:
    f16 = run(spec(context=4096, slots=2)).memory_parts["kvCache"]
    q = run(spec(context=4096, slots=2, kvCache=kv)).memory_parts["kvCache"]
    assert q * ratio[1] == f16 * ratio[0]


def test_kv_cache_scales_with_context_times_slots() -> None:
    assert kv_cache_bytes(28, 4096, 8, 128, 128, KVCacheType.F16) == 2 * 224 * MiB
    one = run(spec(context=4096, slots=1)).memory_parts["kvCache"]
    assert run(spec(context=4096, slots=3)).memory_parts["kvCache"] == 3 * one


def test_memory_names_the_prompt_cache_a_quarter_of_the_kv_cache_by_default() -> None:
    t = run(spec(context=2048))
    assert t.memory_parts["kvCache"] == 224 * MiB
    assert t.memory_parts["promptCache"] == 56 * MiB
    assert t.env["LLAMA_ARG_CACHE_RAM"] == "56"  # Ollama's child inherits it
    effect = next(d.effect for d in t.decisions if d.rule == "memory-from-weights-and-kv")
    assert "+ prompt cache 56Mi +" in effect
    llama = run(spec(**LLAMA, context=4096, slots=2))
    # Gemma 3 270M: 3 whole-context layers at 2 x 4096 cells (24 MiB) and 15 layers at a
    # 1024-cell window per slot (30 MiB); a quarter of 54 MiB rounds up to 14 MiB
    assert llama.args[llama.args.index("--cache-ram") + 1] == "14"
    assert llama.memory_parts["kvCache"] == 54 * MiB
    assert llama.memory_parts["promptCache"] == 14 * MiB
    odd = run(spec(**LLAMA, context=600))  # a quarter that is not whole MiB rounds up
    assert odd.memory_parts["promptCache"] == -(-odd.memory_parts["kvCache"] // 4 // MiB) * MiB


@pytest.mark.parametrize(
    ("asked", "mib"), [("0", 0), ("1", 1), ("256Mi", 256), ("1Gi", 1024), ("100M", 96)]
)
def test_prompt_cache_from_spec_in_whole_mib(asked: str, mib: int) -> None:
    for s in (spec(promptCache=asked), spec(**LLAMA, promptCache=asked)):
        t = run(s)
        told = t.env.get("LLAMA_ARG_CACHE_RAM") or t.args[t.args.index("--cache-ram") + 1]
        assert told == str(mib)
        assert t.memory_parts["promptCache"] == mib * MiB
        assert t.memory_bytes == sum(t.memory_parts.values())


def test_prompt_cache_is_off_when_the_shape_is_unknown_and_checked_with_explicit_memory(
) -> None:
    unknown = run(spec(model="acme/secret-model:7b", memory="8Gi"))
    assert unknown.env["LLAMA_ARG_CACHE_RAM"] == "0"
    assert run(spec(model="acme/x:7b", memory="8Gi", promptCache="1Gi")).env[
        "LLAMA_ARG_CACHE_RAM"] == "1024"
    shape = CATALOG["qwen3:1.7b"]
    budget = memory_decision(shape, context=8192, slots=1, kv_cache=KVCacheType.F16,
                             flash_attention=True, prompt_cache_bytes=0)
    fits = budget.total - budget.kv_cache
    memory = f"{-(-fits // MiB)}Mi"
    assert run(spec(memory=memory, promptCache="0")).warnings == ()
    warned = run(spec(memory=memory, promptCache="1Gi")).warnings
    assert any("prompt cache" in w for w in warned), warned


def test_explicit_memory_below_estimate_warns() -> None:
    t = run(spec(memory="1Gi"))
    assert t.memory_bytes == GiB
    assert any("below" in w for w in t.warnings)
    assert run(spec(memory="16Gi")).warnings == ()


def test_unknown_model_needs_model_info_or_memory() -> None:
    found = problems(spec(model="acme/secret-model:7b"))
    assert found and found[0].field_path == "spec.memory" and "modelInfo" in found[0].reason
    assert problems(spec(model="acme/secret-model:7b", memory="8Gi")) == []
    info = {"weightsSize": "4Gi", "layers": 32, "kvHeads": 8}
    assert problems(spec(model="acme/secret-model:7b", modelInfo=info)) == []
    t = run(spec(model="acme/secret-model:7b", modelInfo=info, context=1024))
    assert t.memory_parts["weights"] == 4 * GiB
    assert t.memory_parts["kvCache"] == 32 * 1024 * 8 * 256 * 2


def test_volume_sized_from_weights_or_spec() -> None:
    t = run(spec())
    assert t.storage_bytes % GiB == 0
    assert t.storage_bytes >= 2 * CATALOG["qwen3:1.7b"].weights_bytes + GiB
    assert run(spec(storage={"size": "50Gi"})).storage_bytes == 50 * GiB


def test_decisions_follow_rule_order() -> None:
    order = [r.id for r in RULES]
    t = run(spec(kvCache="q8_0", engine={"version": "0.31.0"}), AMX_NODE)
    ids = [d.rule for d in t.decisions]
    assert ids == sorted(ids, key=order.index)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.32.2", (0, 32, 2)),
        ("v0.30.0-rc1", (0, 30, 0)),
        ("1", (1, 0, 0)),
        ("latest", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(text: str | None, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("docker.io/ollama/ollama:0.32.2", (0, 32, 2)),
        ("ollama/ollama", None),
        ("registry:5000/ollama:0.31.1", (0, 31, 1)),
        ("ollama/ollama:0.31.1@sha256:ab", None),
    ],
)
def test_image_version(image: str, version: tuple[int, int, int] | None) -> None:
    assert image_version(image) == version


def test_version_range_bounds() -> None:
    r = VersionRange(low=(0, 30, 0), high=(0, 32, 2), unknown=False)
    assert [r.matches(v) for v in [(0, 29, 9), (0, 30, 0), (0, 32, 1), (0, 32, 2), None]] == [
        False,
        True,
        True,
        False,
        False,
    ]


def test_catalog_aliases_and_lookup() -> None:
    assert normalize("qwen3") == "qwen3:8b"
    assert normalize("library/qwen3:latest") == "qwen3:8b"
    assert lookup("QWEN3:1.7B") == CATALOG["qwen3:1.7b"]
    assert lookup("nobody/knows:1b") is None


def test_evaluate_is_pure() -> None:
    s, n = spec(kvCache="q8_0"), AMX_NODE
    cpus, shape = replica_cpus(cpu_limit(n), 4), lookup(s.model)
    assert evaluate(s, n, cpus, shape, None) == evaluate(s, n, cpus, shape, None)


@pytest.mark.parametrize(
    ("version", "env", "removed", "guarded"),
    [
        ((0, 31, 0), {}, True, True),  # the variant gone is enough
        ((0, 31, 0), {"OLLAMA_FLASH_ATTENTION": "0", "OLLAMA_LLM_LIBRARY": "cpu_avx2"}, False,
         False),
        ((0, 24, 0), {"OLLAMA_FLASH_ATTENTION": "0"}, False, True),
        ((0, 24, 0), {}, True, False),
        ((0, 5, 7), {"OLLAMA_FLASH_ATTENTION": "0"}, False, False),  # needs the AVX2 runner too
        ((0, 5, 7), {"OLLAMA_FLASH_ATTENTION": "0", "OLLAMA_LLM_LIBRARY": "cpu_avx2"}, False, True),
        (None, {"OLLAMA_FLASH_ATTENTION": "0"}, True, True),
        (None, {"OLLAMA_FLASH_ATTENTION": "0"}, False, False),
    ],
)
def test_amx_guarded_matches_what_the_amx_rules_apply(
    version: tuple[int, int, int] | None, env: dict[str, str], removed: bool, guarded: bool
) -> None:
    from localmodel.engines.ollama.tuning import amx_guarded, amx_workaround

    assert amx_guarded(version, env, removed) is guarded
    assert ("cpu_avx2" in amx_workaround(version)) is (version is not None and version < (0, 5, 12))
