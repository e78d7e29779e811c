"""The LocalModel API: defaults, and bad input rejected with the field and the reason."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from pydantic import ValidationError

from localmodel.api import (
    DEFAULT_IMAGES,
    MANAGED_ENV,
    EngineName,
    FlashAttention,
    KVCacheType,
    LocalModel,
    LocalModelSpec,
    parse_local_model,
)
from localmodel.engines import FACTS, EngineFacts, ollama
from tests.builders import MakeLocalModel

pytestmark = pytest.mark.unit


def _one_of(names: Iterable[str]) -> str:
    """How pydantic lists an enum's values: 'a', 'b' or 'c'."""
    quoted = [f"'{n}'" for n in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def validated(**spec: Any) -> LocalModel:
    """The API class's own validation (pydantic's `ValidationError`, which this
    file tests), deliberately not `parse_local_model` (tests/builders.py's `obj()`)."""
    return LocalModel.model_validate(MakeLocalModel("m").spec(**spec).manifest())


def test_defaults_match_the_documented_api() -> None:
    s = validated().spec
    assert s.engine.name is EngineName.OLLAMA
    assert s.engine.resolved_image() == ollama.IMAGE
    assert (s.replicas, s.cpu, s.memory, s.context, s.slots) == (1, 4, "auto", 8192, 1)
    assert s.kv_cache is KVCacheType.F16
    assert s.prompt_cache is None  # absent: auto (no schema default, for older operators)
    assert s.flash_attention is FlashAttention.AUTO
    assert s.keep_alive == "-1"
    assert s.placement.exclusive is True and s.placement.safe_cpu_path is False
    assert s.storage.retain is True and s.storage.size is None
    assert s.gateway.enabled is True


def test_camel_case_fields_round_trip() -> None:
    m = validated(kvCache="q8_0", keepAlive="24h", placement={"nodeSelector": {"pool": "amx"}})
    dumped = m.model_dump(by_alias=True, mode="json")
    assert dumped["spec"]["kvCache"] == "q8_0"
    assert dumped["spec"]["placement"]["nodeSelector"] == {"pool": "amx"}
    assert LocalModel.model_validate(dumped) == m


@pytest.mark.parametrize("cpu", [1, 64, "node"])
def test_cpu_accepts_positive_integers_and_node(cpu: int | str) -> None:
    assert validated(cpu=cpu).spec.cpu == cpu


SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_SPEC = {"url": "https://models.example/gemma-3-270m-q4_k_m.gguf", "sha256": SHA}
LLAMA = {"engine": {"name": "llama-server"}, "gguf": GGUF_SPEC}


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"cpu": 0}, "cpu", "positive integer or 'node'"),
        ({"cpu": "4"}, "cpu", "positive integer or 'node'"),
        ({"cpu": True}, "cpu", "positive integer or 'node'"),
        ({"cpu": 2.5}, "cpu", ""),
        ({"context": 100}, "context", "greater than or equal to 512"),
        ({"slots": 0}, "slots", "greater than or equal to 1"),
        ({"kvCache": "q2"}, "kvCache", "'f16', 'q8_0' or 'q4_0'"),
        ({"kvCache": "q4_0", "flashAttention": "disabled"}, "kvCache", "needs flash attention"),
        ({"kvCache": "q8_0", "flashAttention": "disabled"}, "kvCache", "needs flash attention"),
        ({"env": [{"name": "OLLAMA_HOST", "value": "x"}]}, "env", "operator manages"),
        ({"env": [{"name": "GOMAXPROCS", "value": "64"}]}, "env", "operator manages"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env", "once"),
        ({"env": [{"name": "1BAD"}]}, "env", "pattern"),
        ({"engine": {"name": "llama-server"}}, "gguf", "set gguf.url and gguf.sha256"),
        ({"gguf": GGUF_SPEC | {"sha256": "ABC"}}, "gguf.sha256", "pattern"),
        (LLAMA | {"keepAlive": "5m"}, "keepAlive", "always keeps its model loaded"),
        (LLAMA | {"placement": {"safeCpuPath": True}}, "placement", "Ollama's AMX workaround"),
        (LLAMA | {"gguf": GGUF_SPEC | {"sha256": "ABC"}}, "gguf.sha256", "pattern"),
        (LLAMA | {"gguf": GGUF_SPEC | {"url": "ftp://h/m.gguf"}}, "gguf.url", "pattern"),
        (LLAMA | {"gguf": GGUF_SPEC | {"url": "https://h/m?x=1"}}, "gguf", "set gguf.file"),
        (LLAMA | {"gguf": GGUF_SPEC | {"file": "../m.gguf"}}, "gguf.file", "pattern"),
        ({"env": [{"name": "LLAMA_ARG_CTX_SIZE", "value": "9"}]}, "env", "operator manages"),
        ({"engine": {"name": "vllm"}}, "engine.name", _one_of(f.NAME for f in FACTS)),
        ({"memory": "lots"}, "memory", "a quantity from 64Mi to 64Ti"),
        ({"promptCache": "-1"}, "promptCache", "`auto` or a quantity from 0 to 1Ti"),
        ({"promptCache": "2Ti"}, "promptCache", "`auto` or a quantity from 0 to 1Ti"),
        ({"env": [{"name": "LLAMA_ARG_CACHE_RAM", "value": "-1"}]}, "env", "operator manages"),
        (LLAMA | {"env": [{"name": "LLAMA_ARG_CACHE_RAM", "value": "-1"}]}, "env",
         "operator manages"),
        ({"keepAlive": "forever"}, "keepAlive", "pattern"),
        ({"model": ""}, "model", ""),
        ({"replicas": -1}, "replicas", "greater than or equal to 0"),
        ({"storage": {"size": "big"}}, "storage.size", "a quantity from"),
        ({"colour": "blue"}, "colour", "Extra inputs are not permitted"),
        ({"modelInfo": {"weightsSize": "1Gi"}}, "modelInfo.layers", "Field required"),
        ({"gateway": {"overflow": {"model": "m"}}}, "gateway.overflow.url", "Field required"),
        ({"gateway": {"overflow": {"url": "ftp://x", "model": "m"}}}, "overflow.url", "pattern"),
        (
            {"gateway": {"overflow": {"url": "https://x/v1?k=1", "model": "m"}}},
            "overflow.url",
            "pattern",
        ),
        ({"gateway": {"overflow": {"url": "https://x/v1", "model": ""}}}, "overflow.model", ""),
        (
            {"gateway": {"overflow": {"url": "https://x/v1", "model": "m", "after": -1}}},
            "overflow.after",
            "greater than or equal to 0",
        ),
        (
            {
                "gateway": {
                    "overflow": {
                        "url": "https://x/v1",
                        "model": "m",
                        "apiKeySecretRef": {"name": "Bad_Name", "key": "k"},
                    }
                }
            },
            "apiKeySecretRef.name",
            "pattern",
        ),
        (
            {"gateway": {"enabled": False, "overflow": {"url": "https://x/v1", "model": "m"}}},
            "overflow",
            "overflow needs the gateway",
        ),
        (
            {"gateway": {"enabled": False,
                         "auth": {"keysSecretRef": {"name": "keys", "key": "keys.json"}}}},
            "auth", "auth needs the gateway",
        ),
        ({"gateway": {"auth": {}}}, "gateway.auth.keysSecretRef", "Field required"),
        (
            {"gateway": {"auth": {"keysSecretRef": {"name": "keys", "key": "a/b"}}}},
            "keysSecretRef.key", "pattern",
        ),
        (
            {"gateway": {"overflow": {"url": "https://x/v1", "model": "m",
                                      "budget": {"requests": -1}}}},
            "overflow.budget.requests", "greater than or equal to 0",
        ),
        (
            {"gateway": {"overflow": {"url": "https://x/v1", "model": "m",
                                      "budget": {"requests": 1, "windowSeconds": 0}}}},
            "overflow.budget.windowSeconds", "greater than or equal to 1",
        ),
        (
            {"gateway": {"networkPolicy": {"namespaces": ["Team_A"]}}},
            "networkPolicy.namespaces", "DNS-1123 label",
        ),
        (
            {"gateway": {"networkPolicy": {"podLabels": {"bad key!": "x"}}}},
            "networkPolicy.podLabels", "qualified name",
        ),
        ({"gateway": {"networkPolicy": {"enabled": "yes"}}}, "networkPolicy.enabled", ""),
    ],
)
def test_invalid_spec_names_the_field_and_reason(
    spec: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as err:
        validated(**spec)
    text = str(err.value)
    assert field in text
    assert words in text


def test_every_managed_variable_is_rejected_in_env() -> None:
    for name in MANAGED_ENV:
        with pytest.raises(ValidationError, match="operator manages"):
            validated(env=[{"name": name, "value": "1"}])
    debug = validated(env=[{"name": "OLLAMA_DEBUG", "value": "1"}])
    assert debug.spec.env[0].name == "OLLAMA_DEBUG"


def test_quantized_cache_is_fine_with_flash_attention_auto_or_on() -> None:
    for fa in ("auto", "enabled"):
        assert validated(kvCache="q4_0", flashAttention=fa).spec.kv_cache is KVCacheType.Q4_0


def test_spec_is_immutable() -> None:
    spec = LocalModelSpec(model="qwen3:1.7b")
    with pytest.raises(ValidationError):
        spec.cpu = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("toleration", "words"),
    [
        ({"operator": "Equal", "value": "x"}, "without a key must use operator Exists"),
        ({"key": "a", "operator": "Exists", "value": "x"}, "must not set a value"),
    ],
)
def test_toleration_rules_match_kubernetes(toleration: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        validated(placement={"tolerations": [toleration]})
    assert validated(placement={"tolerations": [{"operator": "Exists"}]}).spec.placement.tolerations


def test_overflow_round_trips_with_its_secret_reference() -> None:
    overflow = {
        "url": "https://api.example.com/v1",
        "model": "gpt-4o-mini",
        "apiKeySecretRef": {"name": "llm-keys", "key": "openai"},
        "after": 2.5,
    }
    m = validated(gateway={"overflow": overflow})
    o = m.spec.gateway.overflow
    assert o is not None and o.api_key_secret_ref is not None
    assert (o.url, o.model, o.after, o.api_key_secret_ref.key) == (
        "https://api.example.com/v1",
        "gpt-4o-mini",
        2.5,
        "openai",
    )
    dumped = m.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["spec"]["gateway"]["overflow"] == overflow
    assert validated().spec.gateway.overflow is None


def test_the_autoscaling_docs_model_is_valid_offline_too() -> None:
    """docs/autoscaling.md's LocalModel, as the CLI and operator read it (the
    API server's dry run of the same block is in tests/e2e/test_autoscaling.py)."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md").read_text()
    docs = [
        d
        for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
        for d in yaml.safe_load_all(block)
        if isinstance(d, dict) and d.get("kind") == "LocalModel"
    ]
    (model,) = docs
    overflow = parse_local_model(model).spec.gateway.overflow
    assert overflow is not None and overflow.api_key_secret_ref is not None


def test_ollama_takes_a_gguf_file_and_pulls_without_one() -> None:
    """`gguf` is optional for Ollama: with it, the model comes from the file
    (no registry); without it, Ollama pulls `model`."""
    spec = validated(gguf=GGUF_SPEC).spec
    assert spec.engine.name.value == "ollama"
    assert spec.gguf is not None and spec.gguf.sha256 == SHA
    assert validated().spec.gguf is None


@pytest.mark.parametrize(
    ("gguf", "file"),
    [
        (GGUF_SPEC, "gemma-3-270m-q4_k_m.gguf"),
        (GGUF_SPEC | {"url": "https://h/r/m.Q4_K_M.gguf?download=true"}, "m.Q4_K_M.gguf"),
        (GGUF_SPEC | {"url": "https://h/blob/123", "file": "mine.gguf"}, "mine.gguf"),
    ],
)
def test_llama_server_model_names_its_gguf_file(gguf: dict[str, str], file: str) -> None:
    spec = validated(**(LLAMA | {"gguf": gguf})).spec
    assert spec.engine.name.value == "llama-server"
    assert spec.gguf is not None and spec.gguf.file_name() == file


def test_the_api_names_every_engine_of_the_facts_in_their_order() -> None:
    """spec.engine.name's values, and the default images, come from engines.FACTS."""
    assert [e.value for e in EngineName] == [f.NAME for f in FACTS]
    assert {EngineName(f.NAME): f.IMAGE for f in FACTS} == DEFAULT_IMAGES


@pytest.mark.parametrize("facts", FACTS, ids=lambda f: f.NAME)
def test_each_engine_is_refused_exactly_the_fields_its_facts_say_it_has_no_use_for(
    facts: EngineFacts,
) -> None:
    engine = {"engine": {"name": facts.NAME}}
    base = engine | {"gguf": GGUF_SPEC}

    def refused(**spec: Any) -> bool:
        try:
            validated(**spec)
        except ValidationError:
            return True
        return False

    assert refused(**engine) is facts.NEEDS_GGUF
    assert not refused(**base)
    assert refused(**base, keepAlive="5m") is not facts.KEEP_ALIVE
    assert refused(**base, placement={"safeCpuPath": True}) is not bool(facts.AMX_LIBRARIES)
