"""The admin's policy over tenants (localmodel/tenancy.py), as tables: one case
per rule (the rule and field it names), the policy's own reading, image and
host matching, and the pass: a refused model gets its status and an Event, and
no object (controller/plan.py `plan_pass`)."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.api import LocalModel
from localmodel.controller.config import ConfigError, parse_config
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.events import EventReason, status_events
from localmodel.render import RenderOptions
from localmodel.status import ConditionType, Reason
from localmodel.tenancy import (
    FIELDS,
    RULES,
    LabelRule,
    PolicyError,
    TenantPolicy,
    host_allowed,
    image_location,
    needs_secrets,
    parse_policy,
    refusals,
    registry_allowed,
)
from tests.builders import MakeLocalModel
from tests.controller.test_changes import NODE, NOW, QWEN

pytestmark = pytest.mark.unit

TENANT = MakeLocalModel("chat", "team-a").spec(model="qwen3:1.7b", cpu=2, context=4096)
KEY = {"name": "openai", "key": "token"}
OVERFLOW = {"url": "https://api.openai.com/v1", "model": "gpt-4o-mini", "apiKeySecretRef": KEY}
LABEL = "localmodel.dev/overflow-key=true"
STRICT = TenantPolicy(
    image_registries=("docker.io/ollama", "registry.internal:5000"),
    overflow_hosts=("api.openai.com",),
    secret_label=LabelRule("localmodel.dev/overflow-key", "true"),
    allow_control_plane=False,
    exclusive_namespaces=("platform",),
)
LABELLED = {("team-a", "openai"): {"localmodel.dev/overflow-key": "true"}}


def model(**spec: Any) -> LocalModel:
    """A tenant's model that the STRICT policy admits, with `spec` changed."""
    base = TENANT.spec(gateway={"overflow": OVERFLOW}, placement={"exclusive": False})
    return base.spec(**spec).obj()


# ---- one case per rule -----------------------------------------------------------

RULE_CASES = [
    # (id, spec changes, secrets, (rule, field) refused)
    ("engine image from another registry", {"engine": {"name": "ollama",
                                                       "image": "ghcr.io/evil/ollama:1"}},
     LABELLED, ("imageRegistries", "spec.engine.image")),
    ("gateway image from another registry",
     {"gateway": {"image": "quay.io/x/gateway:1", "overflow": OVERFLOW}},
     LABELLED, ("imageRegistries", "spec.gateway.image")),
    ("overflow to another host", {"gateway": {"overflow": {**OVERFLOW,
                                                            "url": "https://evil.example/v1"}}},
     LABELLED, ("overflowHosts", "spec.gateway.overflow.url")),
    ("overflow key Secret without the label", {}, {("team-a", "openai"): {"app": "x"}},
     ("secretLabel", "spec.gateway.overflow.apiKeySecretRef.name")),
    ("tolerating every taint",
     {"placement": {"exclusive": False, "tolerations": [{"operator": "Exists"}]}},
     LABELLED, ("allowControlPlane", "spec.placement.tolerations[0]")),
    ("holding nodes exclusively outside the allowed namespaces", {"placement": {}},
     LABELLED, ("exclusiveNamespaces", "spec.placement.exclusive")),
]


def test_the_table_covers_every_rule() -> None:
    # (controlPlaneTaints is no rule of its own: the list allowControlPlane judges by)
    assert len({case[3][0] for case in RULE_CASES}) == len(RULES) == len(FIELDS) - 1


def test_the_base_model_is_admitted() -> None:
    assert refusals(model(), STRICT, LABELLED) == ()


@pytest.mark.parametrize(("changes", "secrets", "refused"),
                         [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_each_rule_refuses_naming_itself_and_the_field(
    changes: dict[str, Any], secrets: Any, refused: tuple[str, str]
) -> None:
    found = refusals(model(**changes), STRICT, secrets)
    assert [(r.rule, r.field) for r in found] == [refused]
    error = found[0].error()
    assert error.field_path == refused[1]
    assert f"policy.{refused[0]}" in error.reason


@pytest.mark.parametrize(("changes", "secrets"), [c[1:3] for c in RULE_CASES],
                         ids=[c[0] for c in RULE_CASES])
def test_the_default_policy_refuses_only_control_plane_tolerations(
    changes: dict[str, Any], secrets: Any
) -> None:
    found = refusals(model(**changes), TenantPolicy(), {})
    tolerates_all = any(t.get("operator") == "Exists" and not t.get("key")
                        for t in changes.get("placement", {}).get("tolerations", []))
    assert [r.rule for r in found] == (["allowControlPlane"] if tolerates_all else [])


@pytest.mark.parametrize(("toleration", "refused"), [
    ({"operator": "Exists"}, True),
    ({"operator": "Exists", "effect": "NoExecute"}, True),  # (every key: conservative)
    ({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}, True),
    ({"key": "node-role.kubernetes.io/master", "operator": "Equal", "value": "",
      "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "operator": "Exists"}, False),
    ({"key": "dedicated", "operator": "Equal", "value": "ai"}, False),
])
def test_control_plane_tolerations(toleration: dict[str, str], refused: bool) -> None:
    lm = model(placement={"exclusive": False, "tolerations": [toleration]})
    assert bool(refusals(lm, STRICT, LABELLED)) is refused
    allowed = TenantPolicy(allow_control_plane=True)
    assert refusals(lm, allowed) == ()


def test_the_overflow_key_rule_needs_the_secret_found_and_its_value() -> None:
    lm = model()
    assert needs_secrets(lm, STRICT) == (("team-a", "openai"),)
    assert needs_secrets(lm, TenantPolicy()) == ()
    [missing] = refusals(lm, STRICT, {})
    assert "not found" in missing.reason
    [wrong] = refusals(lm, STRICT, {("team-a", "openai"): {"localmodel.dev/overflow-key": "no"}})
    assert wrong.rule == "secretLabel"
    # The same name in another namespace is another Secret.
    assert refusals(lm, STRICT, {("team-b", "openai"): {"localmodel.dev/overflow-key": "true"}})
    any_value = TenantPolicy(secret_label=LabelRule("localmodel.dev/overflow-key"))
    blank = {("team-a", "openai"): {"localmodel.dev/overflow-key": ""}}
    assert refusals(lm, any_value, blank) == ()
    no_key = model(gateway={"overflow": {k: v for k, v in OVERFLOW.items()
                                         if k != "apiKeySecretRef"}})
    assert needs_secrets(no_key, STRICT) == () and refusals(no_key, STRICT, {}) == ()


def test_exclusive_is_allowed_in_a_listed_namespace_and_shared_anywhere() -> None:
    platform = MakeLocalModel("chat", "platform").spec(
        model="qwen3:1.7b", gateway={"overflow": OVERFLOW}).obj()
    secrets = {("platform", "openai"): {"localmodel.dev/overflow-key": "true"}}
    assert refusals(platform, STRICT, secrets) == ()
    nobody = TenantPolicy(exclusive_namespaces=())
    assert [r.rule for r in refusals(platform, nobody)] == ["exclusiveNamespaces"]
    assert refusals(model(), nobody) == ()  # exclusive: false


def test_a_gateway_turned_off_carries_no_gateway_choices() -> None:
    lm = model(gateway={"enabled": False, "image": "quay.io/x/gw:1"})
    assert refusals(lm, STRICT, {}) == ()
    assert [r.field for r in refusals(model(gateway={"image": "quay.io/x/gw:1"}), STRICT)] == [
        "spec.gateway.image"]


# ---- matching ----------------------------------------------------------------------

@pytest.mark.parametrize(("image", "location"), [
    ("ollama/ollama:v1", "docker.io/ollama/ollama"),
    ("ubuntu", "docker.io/library/ubuntu"),
    ("ubuntu:24.04", "docker.io/library/ubuntu"),
    ("docker.io/ollama/ollama:v1", "docker.io/ollama/ollama"),
    ("ghcr.io/ggml-org/llama.cpp:server", "ghcr.io/ggml-org/llama.cpp"),
    ("registry.internal:5000/ollama@sha256:" + "a" * 64, "registry.internal:5000/ollama"),
    ("localhost/x:1", "localhost/x"),
    ("GHCR.IO/org/x", "ghcr.io/org/x"),
])
def test_image_location_as_the_runtime_normalises_it(image: str, location: str) -> None:
    assert image_location(image) == location


@pytest.mark.parametrize(("image", "allowed", "ok"), [
    ("ollama/ollama:1", ("docker.io",), True),
    ("ollama/ollama:1", ("docker.io/ollama",), True),
    ("ollamax/ollama:1", ("docker.io/ollama",), False),  # a path prefix ends at a /
    ("ghcr.io.evil.com/x:1", ("ghcr.io",), False),
    ("ghcr.io/x:1", ("ghcr.io",), True),
    ("registry.internal:5000/x:1", ("registry.internal",), False),  # the port is part of it
    ("anything.example/x", ("*",), True),
    ("ghcr.io/x:1", (), False),
])
def test_registry_allowed(image: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert registry_allowed(image, allowed) is ok


@pytest.mark.parametrize(("url", "allowed", "ok"), [
    ("https://api.openai.com/v1", ("api.openai.com",), True),
    ("https://API.OpenAI.com/v1", ("api.openai.com",), True),
    ("https://api.openai.com.evil.com/v1", ("api.openai.com",), False),
    ("https://api.openai.com@evil.com/v1", ("api.openai.com",), False),  # userinfo, not host
    ("https://llm.corp.example/v1", ("*.corp.example",), True),
    ("https://corp.example/v1", ("*.corp.example",), False),
    ("https://api.example:8443/v1", ("api.example:8443",), True),
    ("https://api.example/v1", ("api.example:8443",), False),
    ("http://api.example:8080/v1", ("api.example",), True),
    ("https://x.example/v1", ("*",), True),
    ("https://x.example/v1", (), False),
])
def test_host_allowed(url: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert host_allowed(url, allowed) is ok


# ---- reading a policy --------------------------------------------------------------

def test_a_policy_reads_every_setting() -> None:
    got = parse_policy({"imageRegistries": ["docker.io/ollama", "registry.internal:5000"],
                        "overflowHosts": ["api.openai.com"],
                        "secretLabel": LABEL,
                        "allowControlPlane": False,
                        "exclusiveNamespaces": ["platform"]})
    assert got == STRICT
    assert parse_policy(None) == parse_policy({}) == TenantPolicy()
    assert parse_policy({"secretLabel": ""}).secret_label is None


@pytest.mark.parametrize(("raw", "field"), [
    ({"imageRegistries": "ghcr.io"}, "imageRegistries"),
    ({"imageRegistries": ["https://ghcr.io"]}, "imageRegistries[0]"),
    ({"imageRegistries": ["GHCR.io"]}, "imageRegistries[0]"),  # not coerced
    ({"imageRegistries": ["ghcr.io"] * 300}, "imageRegistries"),
    ({"overflowHosts": ["https://api.openai.com"]}, "overflowHosts[0]"),
    ({"overflowHosts": [1]}, "overflowHosts[0]"),
    ({"secretLabel": "bad key=x"}, "secretLabel"),
    ({"secretLabel": ["a"]}, "secretLabel"),
    ({"overflowKeySecretLabel": ["a"]}, "overflowKeySecretLabel"),
    ({"allowControlPlane": "yes"}, "allowControlPlane"),
    ({"exclusiveNamespaces": ["Team_A"]}, "exclusiveNamespaces[0]"),
    ({"allowHttp": True}, "allowHttp"),
])
def test_a_bad_policy_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(raw)
    assert [err.field_path for err in e.value.errors] == [field]


def test_the_operator_reads_its_policy_file(tmp_path: Any) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text("imageRegistries: [ghcr.io]\nallowControlPlane: true\n")
    config = parse_config(["--policy", str(good)], {})
    assert config.tenants == TenantPolicy(image_registries=("ghcr.io",),
                                          allow_control_plane=True)
    assert parse_config([], {"LOCALMODEL_POLICY": str(good)}).tenants == config.tenants
    assert parse_config([], {}).tenants == TenantPolicy()
    bad = tmp_path / "bad.yaml"
    bad.write_text("overflowHosts: api.openai.com\n")
    with pytest.raises(ConfigError, match=r"--policy: .*bad.yaml: policy.overflowHosts: must"):
        parse_config(["--policy", str(bad)], {})
    with pytest.raises(ConfigError, match=r"--policy: .*missing"):
        parse_config(["--policy", str(tmp_path / "missing.yaml")], {})


# ---- the pass ----------------------------------------------------------------------

def test_a_refused_model_gets_its_status_and_an_event_and_nothing_else() -> None:
    refused = QWEN.named("refused").uid("uid-refused").spec(
        engine={"name": "ollama", "image": "quay.io/x/ollama:1"})
    snap = Snapshot(localmodels=[QWEN.manifest(), refused.manifest()],
                    nodes=[NODE.named(f"n{i}").manifest() for i in range(2)])
    policy = TenantPolicy(image_registries=("docker.io/ollama",))
    planned = plan_pass(observe(snap), NOW, RenderOptions(), placed={}, avoid={},
                        tenants=policy)
    work = {w.model.name: w for w in planned.work}
    assert work["refused"].changes.changes == ()
    assert "ai/refused" not in planned.placed
    valid = next(c for c in work["refused"].status.conditions
                 if c.type == ConditionType.VALID.value)
    assert (valid.status.value, valid.reason) == ("False", Reason.REFUSED_BY_POLICY.value)
    assert valid.message.startswith("spec.engine.image: refused by the admin policy "
                                    "(policy.imageRegistries)")
    [event] = status_events(None, work["refused"].status)
    assert (event.reason, event.warning) == (EventReason.REFUSED_BY_POLICY, True)
    assert event.message == valid.message
    # The admitted model is planned as without a policy.
    assert work["qwen3"].changes.changes
    assert planned.placed["ai/qwen3"] == plan_pass(
        observe(snap), NOW, RenderOptions(), placed={}, avoid={}).placed["ai/qwen3"]
    # Allowed again: planned like any other model.
    again = plan_pass(observe(snap), NOW, RenderOptions(), placed={}, avoid={})
    assert {w.model.name for w in again.work if w.changes.changes} == {"qwen3", "refused"}
