"""The admin's policy over the Secrets a LocalModel names and the taints it
tolerates (localmodel/tenancy.py), as tables: every Secret reference the API
can make is under `policy.secretLabel` (found by walking the API models, so a
new one cannot be forgotten), each refused by its own field; the control-plane
taints are a policy list whose default is the known keys. The pass reads the
labels of each named Secret (the API server a stand-in, in-process)."""

from __future__ import annotations

import asyncio
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from localmodel.api import LocalModel, LocalModelSpec, SecretKeyRef
from localmodel.controller.config import OperatorConfig
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.snapshot import Snapshot
from localmodel.controller.watched import WATCHED
from localmodel.controller.writer import KubeError
from localmodel.tenancy import (
    CONTROL_PLANE_TAINTS,
    SECRET_REFS,
    LabelRule,
    PolicyError,
    TenantPolicy,
    needs_secrets,
    parse_policy,
    refusals,
)
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

RULE = LabelRule("localmodel.dev/tenant-secret", "true")
POLICY = TenantPolicy(secret_label=RULE)
BASE = MakeLocalModel("chat", "team-a").spec(model="qwen3:1.7b", cpu=2, context=4096)
OVERFLOW = {"url": "https://api.openai.com/v1", "model": "gpt-4o-mini"}


def _types(annotation: Any) -> Iterator[Any]:
    """The classes an annotation names (through Optional, unions, lists, Annotated)."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is None and not args:
        yield annotation
        return
    if origin is typing.Annotated:
        yield from _types(args[0])
        return
    if origin in (typing.Union, types.UnionType, list, tuple, dict) or args:
        for a in args:
            yield from _types(a)


def secret_fields(model: type[BaseModel], path: str) -> Iterator[str]:
    """The path (as the API spells it) of every field under `model` that names a
    Secret: a SecretKeyRef, or any field whose name says secret."""
    for name, info in model.model_fields.items():
        here = f"{path}.{info.alias or name}"
        found = list(_types(info.annotation))
        if SecretKeyRef in found or "secret" in name.lower():
            yield here
            continue
        for t in found:
            if isinstance(t, type) and issubclass(t, BaseModel):
                yield from secret_fields(t, here)


def test_every_secret_the_api_can_name_is_under_the_secret_label_rule() -> None:
    walked = set(secret_fields(LocalModelSpec, "spec"))
    assert walked == {field for field, _ in SECRET_REFS}
    assert walked  # (the walk finds the known ones: it does look)


# field -> the spec naming Secret "s" there (and no other Secret)
NAMING = {
    "spec.gateway.auth.keysSecretRef": {
        "gateway": {"auth": {"keysSecretRef": {"name": "s", "key": "keys.json"}}}},
    "spec.gateway.overflow.apiKeySecretRef": {
        "gateway": {"overflow": {**OVERFLOW, "apiKeySecretRef": {"name": "s", "key": "k"}}}},
}


def naming(field: str, **gateway: Any) -> LocalModel:
    spec = NAMING[field]
    return BASE.spec(gateway={**spec["gateway"], **gateway}).obj()


def test_the_table_names_every_reference() -> None:
    assert set(NAMING) == {field for field, _ in SECRET_REFS}


@pytest.mark.parametrize("field", sorted(NAMING))
def test_a_secret_named_without_the_label_is_refused_naming_field_secret_and_label(
    field: str,
) -> None:
    lm = naming(field)
    assert needs_secrets(lm, POLICY) == (("team-a", "s"),)
    [refused] = refusals(lm, POLICY, {("team-a", "s"): {"app": "x"}})
    error = refused.error()
    assert error.field_path == f"{field}.name"
    assert "policy.secretLabel" in error.reason
    assert "Secret s " in error.reason and str(RULE) in error.reason
    [missing] = refusals(lm, POLICY, {})
    assert missing.field == f"{field}.name" and "not found" in missing.reason
    # The same name in another namespace is another Secret.
    assert refusals(lm, POLICY, {("team-b", "s"): {RULE.key: "true"}})


@pytest.mark.parametrize("field", sorted(NAMING))
def test_a_secret_named_with_the_label_is_admitted(field: str) -> None:
    lm = naming(field)
    assert refusals(lm, POLICY, {("team-a", "s"): {RULE.key: "true"}}) == ()
    # Without the rule, any Secret of the namespace, and none is read.
    assert refusals(lm, TenantPolicy(), {}) == ()
    assert needs_secrets(lm, TenantPolicy()) == ()


def test_a_model_naming_two_secrets_is_refused_for_each_unlabelled_one() -> None:
    lm = BASE.spec(gateway={
        "auth": {"keysSecretRef": {"name": "keys", "key": "keys.json"}},
        "overflow": {**OVERFLOW, "apiKeySecretRef": {"name": "openai", "key": "k"}}}).obj()
    assert needs_secrets(lm, POLICY) == (("team-a", "keys"), ("team-a", "openai"))
    found = refusals(lm, POLICY, {("team-a", "openai"): {RULE.key: "true"},
                                  ("team-a", "keys"): {}})
    assert [r.field for r in found] == ["spec.gateway.auth.keysSecretRef.name"]
    same = BASE.spec(gateway={
        "auth": {"keysSecretRef": {"name": "s", "key": "keys.json"}},
        "overflow": {**OVERFLOW, "apiKeySecretRef": {"name": "s", "key": "k"}}}).obj()
    assert needs_secrets(same, POLICY) == (("team-a", "s"),)  # read once
    assert len(refusals(same, POLICY, {})) == 2  # refused at each field


@pytest.mark.parametrize(("raw", "label"), [
    ({"secretLabel": "localmodel.dev/tenant-secret=true"}, RULE),
    ({"overflowKeySecretLabel": "localmodel.dev/tenant-secret=true"}, RULE),  # its older name
    ({"secretLabel": "", "overflowKeySecretLabel": "localmodel.dev/tenant-secret=true"}, RULE),
    ({"secretLabel": str(RULE), "overflowKeySecretLabel": str(RULE)}, RULE),
    ({"overflowKeySecretLabel": ""}, None),
])
def test_the_secret_label_is_read_under_its_name_and_its_older_one(
    raw: dict[str, Any], label: LabelRule | None,
) -> None:
    assert parse_policy(raw).secret_label == label


def test_the_secret_label_and_its_older_name_saying_otherwise_are_refused() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy({"secretLabel": "a=b", "overflowKeySecretLabel": "c=d"})
    [error] = e.value.errors
    assert error.field_path == "overflowKeySecretLabel"
    assert "secretLabel" in error.reason


# ---- control-plane taints ----------------------------------------------------------

@pytest.mark.parametrize("key", [
    "node-role.kubernetes.io/control-plane",  # kubeadm
    "node-role.kubernetes.io/master",  # kubeadm up to 1.24
    "node-role.kubernetes.io/controlplane",  # RKE1
    "node-role.kubernetes.io/etcd",  # RKE1
    "CriticalAddonsOnly",  # system node pools
])
def test_a_toleration_of_a_known_control_plane_taint_is_refused_by_default(key: str) -> None:
    lm = BASE.spec(placement={"tolerations": [{"key": key, "operator": "Exists"}]}).obj()
    [refused] = refusals(lm, TenantPolicy())
    assert (refused.rule, refused.field) == ("allowControlPlane",
                                             "spec.placement.tolerations[0]")
    assert key in refused.reason and "policy.controlPlaneTaints" in refused.reason
    assert refusals(lm, TenantPolicy(allow_control_plane=True)) == ()


@pytest.mark.parametrize(("taints", "key", "refused"), [
    (["example.com/infra"], "example.com/infra", True),  # the admin's own
    (["example.com/infra"], "node-role.kubernetes.io/control-plane", False),  # replaced
    ([], "node-role.kubernetes.io/control-plane", False),
    ([*CONTROL_PLANE_TAINTS, "example.com/infra"], "example.com/infra", True),
    ([*CONTROL_PLANE_TAINTS, "example.com/infra"], "dedicated", False),
])
def test_the_control_plane_taints_are_the_policys_list(
    taints: list[str], key: str, refused: bool,
) -> None:
    policy = parse_policy({"controlPlaneTaints": taints})
    assert policy.control_plane_taints == tuple(taints)
    lm = BASE.spec(placement={"tolerations": [{"key": key, "operator": "Exists"}]}).obj()
    assert bool(refusals(lm, policy)) is refused
    # Every taint (Exists without a key) matches whatever the list says.
    every = BASE.spec(placement={"tolerations": [{"operator": "Exists"}]}).obj()
    assert [r.rule for r in refusals(every, policy)] == ["allowControlPlane"]


def test_the_default_control_plane_taints_are_the_known_keys() -> None:
    assert parse_policy({}).control_plane_taints == CONTROL_PLANE_TAINTS == (
        "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master",
        "node-role.kubernetes.io/controlplane", "node-role.kubernetes.io/etcd",
        "CriticalAddonsOnly")


@pytest.mark.parametrize(("raw", "field"), [
    ({"controlPlaneTaints": "node-role.kubernetes.io/etcd"}, "controlPlaneTaints"),
    ({"controlPlaneTaints": ["a b"]}, "controlPlaneTaints[0]"),
    ({"controlPlaneTaints": ["ok", "*"]}, "controlPlaneTaints[1]"),
    ({"controlPlaneTaints": [3]}, "controlPlaneTaints[0]"),
    ({"controlPlaneTaints": ["x"] * 300}, "controlPlaneTaints"),
])
def test_a_bad_control_plane_taint_list_names_the_field(raw: dict[str, Any],
                                                         field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(raw)
    assert [err.field_path for err in e.value.errors] == [field]


# ---- the pass reads the labels of every Secret a model names -------------------------

class SecretsApi:
    """Stand-in for controller.writer.Kube, in-process: answers GETs of Secrets
    (metadata only) from `labels`, 404 for any other, and records what the
    reconciler asks for and writes."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels = labels
        self.asked: list[tuple[str, str]] = []  # (path, accept)
        self.created: list[dict[str, Any]] = []
        self.statuses: dict[str, dict[str, Any]] = {}

    async def get(self, path: str, accept: str = "application/json") -> Any:
        self.asked.append((path, accept))
        name = path.rsplit("/", 1)[1]
        if name not in self.labels:
            raise KubeError("GET", path, 404, {"reason": "NotFound"})
        return {"kind": "PartialObjectMetadata", "metadata": {
            "name": name, "labels": self.labels[name]}}

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.created.append(manifest)
        return dict(manifest)

    async def apply(self, manifest: dict[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        if subresource == "status":
            self.statuses[manifest["metadata"]["name"]] = manifest["status"]
        return dict(manifest)

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        return None


def run_pass(api: SecretsApi, *models: MakeLocalModel) -> None:
    nodes = [MakeNode(f"n{i}").cpu_flags({"AVX2"}).registered().manifest() for i in range(2)]
    rec = Reconciler(OperatorConfig(tenants=POLICY), api,  # type: ignore[arg-type]
                     OperatorMetrics())
    snap = Snapshot(localmodels=[m.manifest() for m in models], nodes=nodes)
    for w in WATCHED:
        items = list(getattr(snap, w.name))
        rec.sources[w.name] = lambda items=items: items  # type: ignore[misc]
    asyncio.run(rec.reconcile_once())


def test_a_pass_reads_the_keys_files_labels_and_refuses_an_unlabelled_one() -> None:
    keys = BASE.named("keys").uid("uid-keys").generation(1).spec(
        placement={"exclusive": False},
        gateway={"auth": {"keysSecretRef": {"name": "team-keys", "key": "keys.json"}}})
    api = SecretsApi({"team-keys": {"app": "chat"}})
    run_pass(api, keys)
    assert api.asked == [("/api/v1/namespaces/team-a/secrets/team-keys",
                          api.asked[0][1])]
    assert "PartialObjectMetadata" in api.asked[0][1]  # (its data never read)
    valid = next(c for c in api.statuses["keys"]["conditions"] if c["type"] == "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "RefusedByPolicy")
    assert valid["message"].startswith("spec.gateway.auth.keysSecretRef.name: refused by "
                                       "the admin policy (policy.secretLabel): Secret "
                                       "team-keys does not carry the label "
                                       f"{RULE}")
    assert not [m for m in api.created if m["kind"] == "Pod"]
    assert [m["reason"] for m in api.created if m["kind"] == "Event"] == ["RefusedByPolicy"]
    # Labelled: the same model is admitted and placed.
    labelled = SecretsApi({"team-keys": {RULE.key: "true"}})
    run_pass(labelled, keys)
    assert [m for m in labelled.created if m["kind"] == "Pod"]
