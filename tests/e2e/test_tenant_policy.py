"""The admin's policy over tenants and the per-namespace binding, against a real
control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok).

The chart is rendered with `namespaces` and a `policy`; its RBAC (a Role and
RoleBinding per listed namespace, a ClusterRole for nodes and volumes only) is
applied and `localmodel run` runs as the chart's identity with the policy file
the chart's ConfigMap holds. Each rule refuses a model that breaks it: Valid=False
(RefusedByPolicy) naming the rule and the field, a RefusedByPolicy Event, and no
pod, claim, Service or ConfigMap; `localmodel render --policy` refuses the same
manifest with the same words. A compliant model in a listed namespace is placed
and Ready; the API server forbids the operator everything in a namespace not
listed.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.commands import render_main
from localmodel.contract import LABEL_NAME
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.chart import NAMESPACE, of_kind, operator_objects, render_chart
from tests.harness.cluster import OPERATOR, OPERATOR_USER
from tests.harness.fixtures import tools_or_fail
from tests.harness.operator import CRD_FILE, RBAC_KINDS, OperatorProcess, wait_condition
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes.yaml"
LM = "/apis/localmodel.dev/v1alpha1"
SUFFIX = secrets.token_hex(2)
TENANT = f"pol-a-{SUFFIX}"  # listed; may not hold nodes exclusively
PLATFORM = f"pol-b-{SUFFIX}"  # listed; may
OTHER = f"pol-x-{SUFFIX}"  # not listed
LABEL_KEY = "localmodel.dev/overflow-key"
POLICY_VALUES = (
    f"namespaces={{{TENANT},{PLATFORM}}}",
    "probe.enabled=false",
    "policy.imageRegistries={docker.io/ollama,ghcr.io/ggml-org}",
    "policy.overflowHosts={api.openai.com}",
    f"policy.secretLabel={LABEL_KEY}=true",
    "policy.allowControlPlane=false",
    f"policy.exclusiveNamespaces={{{PLATFORM}}}",
)
OVERFLOW = {"url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
            "apiKeySecretRef": {"name": "openai", "key": "token"}}
KEYS_FILE = {"keysSecretRef": {"name": "tenant-keys", "key": "token"}}
# A model the policy admits in TENANT: every rule's case below changes one field.
GOOD = MakeLocalModel("good", TENANT).spec(
    model="qwen3:0.6b", cpu=2, context=4096, placement={"exclusive": False},
    storage={"retain": False, "size": "5Gi"})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """The cluster, the CRD and the chart's per-namespace RBAC; no operator yet."""
    c = TestCluster(fixture=NODES, tools=tools_or_fail())
    try:
        c.start()
        api = c.api()
        for ns in (NAMESPACE, TENANT, PLATFORM, OTHER):
            api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        c.apply(CRD_FILE)
        c.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                  "crd/localmodels.localmodel.dev")
        c.kubectl("annotate", "storageclass", "local-disk",
                  "storageclass.kubernetes.io/is-default-class=true")
        c.apply(chart_rbac(c))
        yield c
    finally:
        c.stop()


def chart(c: TestCluster) -> list[dict[str, Any]]:
    assert c.tools is not None
    return operator_objects(render_chart(c.tools, kube_version=c.tools.kubernetes_version,
                                         set_values=POLICY_VALUES))


def chart_rbac(c: TestCluster) -> list[dict[str, Any]]:
    return [m for m in chart(c) if m["kind"] in RBAC_KINDS]


@pytest.fixture(scope="module")
def policy_file(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policy as the chart's ConfigMap holds it (the operator's --policy file)."""
    [config_map] = [m for m in of_kind(chart(cluster), "ConfigMap")
                    if m["metadata"]["name"].endswith("-policy")]
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(config_map["data"]["policy.yaml"])
    return path


@pytest.fixture(scope="module")
def operator(cluster: TestCluster, policy_file: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, identity="operator-policy", extra_args=(
        "--namespace", TENANT, "--namespace", PLATFORM, "--policy", str(policy_file)))
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(f"\n--- operator log tail:\n{op.log_tail(30)}")


def apply(cluster: TestCluster, *objs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objs)))


def made_for(cluster: TestCluster, ns: str, name: str) -> list[str]:
    """Every pod, claim, Service and ConfigMap the operator made for the model."""
    api = cluster.api()
    found = []
    for plural in ("pods", "persistentvolumeclaims", "services", "configmaps"):
        items = api.get(f"/api/v1/namespaces/{ns}/{plural}?labelSelector={LABEL_NAME}={name}")
        found += [f"{plural}/{i['metadata']['name']}" for i in items["items"]]
    return found


def events_of(cluster: TestCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api().get(
        f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}")["items"]
    return items


def valid_condition(lm: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in lm["status"]["conditions"] if c["type"] == "Valid")


def secret(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": TENANT, "labels": labels},
            "stringData": {"token": "sk-test"}}


# ---- one test per rule -------------------------------------------------------------

RULES = [
    # (the rule, a model breaking it and nothing else, the field it names);
    # secretLabel: once per field naming a Secret (tenancy.SECRET_REFS)
    ("imageRegistries", GOOD.named("reg").spec(
        engine={"name": "ollama", "image": "quay.io/someone/ollama:v1"}),
     "spec.engine.image"),
    ("overflowHosts", GOOD.named("host").spec(gateway={"overflow": {
        "url": "https://api.openai.com@collector.example/v1", "model": "gpt-4o-mini"}}),
     "spec.gateway.overflow.url"),
    ("secretLabel", GOOD.named("key").spec(gateway={"overflow": OVERFLOW}),
     "spec.gateway.overflow.apiKeySecretRef.name"),
    ("secretLabel", GOOD.named("keys").spec(gateway={"auth": KEYS_FILE}),
     "spec.gateway.auth.keysSecretRef.name"),
    ("allowControlPlane", GOOD.named("cp").spec(placement={
        "exclusive": False, "tolerations": [{"operator": "Exists"}]}),
     "spec.placement.tolerations[0]"),
    ("allowControlPlane", GOOD.named("etcd").spec(placement={  # RKE1's etcd role
        "exclusive": False, "tolerations": [{"key": "node-role.kubernetes.io/etcd",
                                             "operator": "Exists"}]}),
     "spec.placement.tolerations[0]"),
    ("exclusiveNamespaces", GOOD.named("excl").spec(placement={"exclusive": True}),
     "spec.placement.exclusive"),
]


@pytest.mark.parametrize(("model", "rule", "field"), [(m, r, f) for r, m, f in RULES],
                         ids=[f"{r}-{m.name}" for r, m, _ in RULES])
def test_a_model_breaking_a_rule_is_refused_naming_it_and_nothing_is_made(
    cluster: TestCluster, operator: OperatorProcess, policy_file: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], model: MakeLocalModel, rule: str, field: str,
) -> None:
    name = model.name
    named = model.obj().spec.gateway
    secret_name = ("openai" if named.overflow else "tenant-keys" if named.auth else "")
    if rule == "secretLabel":  # the Secret exists, without the label
        apply(cluster, secret(secret_name, {"app": "chat"}))
    apply(cluster, model.manifest())
    lm = wait_condition(cluster, TENANT, name, "Valid", "False", timeout=90)
    valid = valid_condition(lm)
    assert valid["reason"] == "RefusedByPolicy"
    assert valid["message"].startswith(f"{field}: refused by the admin policy (policy.{rule})")
    assert "\n" not in valid["message"]  # (this rule alone)
    ready = next(c for c in lm["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RefusedByPolicy")
    # Changes are written before the status in a pass: none were made.
    assert made_for(cluster, TENANT, name) == []
    wait_until(f"the RefusedByPolicy Event of {name}",
               lambda: any(e["reason"] == "RefusedByPolicy" and e["type"] == "Warning"
                           and e["message"] == valid["message"]
                           for e in events_of(cluster, TENANT, name)), timeout=30)
    # Offline, the same policy refuses the same manifest with the same words.
    manifest = tmp_path / "model.yaml"
    manifest.write_text(yaml.safe_dump(model.manifest()))
    args = ["-f", str(manifest), "--policy", str(policy_file)]
    if rule == "secretLabel":
        stored = tmp_path / "secrets.yaml"
        stored.write_text(cluster.kubectl("get", "secret", secret_name, "-n", TENANT,
                                          "-o", "yaml").stdout)
        args += ["--secrets", str(stored)]
    capsys.readouterr()
    assert render_main(args) == 2
    err = capsys.readouterr().err
    assert f"LocalModel {TENANT}/{name}: {valid['message']}" in err


def test_a_compliant_model_runs_and_a_labelled_secret_admits_its_overflow_and_keys(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    apply(cluster, GOOD.manifest(),
          GOOD.named("shared", PLATFORM).spec(placement={"exclusive": True}).manifest())
    for ns, name in ((TENANT, "good"), (PLATFORM, "shared")):
        wait_condition(cluster, ns, name, "Ready", "True", timeout=120)
        assert any(m.startswith("pods/") for m in made_for(cluster, ns, name))
    # The overflow key's Secret gains the label: the operator reads it again
    # (metadata only, within its re-read bound) and admits the model.
    apply(cluster, secret("openai", {}))
    keyed = GOOD.named("keyed").spec(gateway={"overflow": OVERFLOW})
    apply(cluster, keyed.manifest())
    wait_condition(cluster, TENANT, "keyed", "Valid", "False", timeout=90)
    apply(cluster, secret("openai", {LABEL_KEY: "true"}))
    wait_condition(cluster, TENANT, "keyed", "Valid", "True", timeout=120)
    wait_until("the keyed model's pod", lambda: any(
        m.startswith("pods/") for m in made_for(cluster, TENANT, "keyed")), timeout=60)
    assert any(e["reason"] == "SpecValid" for e in events_of(cluster, TENANT, "keyed"))
    # The same for a keys file: the one rule covers every Secret a model names.
    apply(cluster, secret("tenant-keys", {}))
    apply(cluster, GOOD.named("keyed-file").spec(gateway={"auth": KEYS_FILE}).manifest())
    wait_condition(cluster, TENANT, "keyed-file", "Valid", "False", timeout=90)
    apply(cluster, secret("tenant-keys", {LABEL_KEY: "true"}))
    wait_condition(cluster, TENANT, "keyed-file", "Valid", "True", timeout=120)


# ---- the per-namespace binding -----------------------------------------------------


def can(cluster: TestCluster, verb: str, resource: str, namespace: str = "",
        group: str = "") -> bool:
    """A SubjectAccessReview for the operator's user: what RBAC allows it."""
    attributes = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attributes["namespace"] = namespace
    review = cluster.api().create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
         "spec": {"user": OPERATOR_USER, "resourceAttributes": attributes}})
    return bool(review["status"].get("allowed"))


@pytest.mark.parametrize(("verb", "resource", "group"), [
    ("create", "pods", ""), ("delete", "pods", ""), ("create", "persistentvolumeclaims", ""),
    ("patch", "services", ""), ("create", "configmaps", ""), ("create", "events", ""),
    ("list", "localmodels", "localmodel.dev"), ("patch", "localmodels/status", "localmodel.dev"),
    ("get", "secrets", ""),
])
def test_the_operator_may_act_in_listed_namespaces_only(
    cluster: TestCluster, verb: str, resource: str, group: str
) -> None:
    assert can(cluster, verb, resource, TENANT, group)
    assert can(cluster, verb, resource, PLATFORM, group)
    assert not can(cluster, verb, resource, OTHER, group)
    assert not can(cluster, verb, resource, "", group)  # (cluster-wide)


def test_cluster_wide_it_only_reads_nodes_and_volumes(cluster: TestCluster) -> None:
    for resource in ("nodes", "persistentvolumes"):
        assert can(cluster, "list", resource) and can(cluster, "watch", resource)
        assert not can(cluster, "patch", resource)
    assert not can(cluster, "list", "secrets", OTHER)
    assert not can(cluster, "list", "secrets", TENANT)  # get by name, never a listing


def test_a_real_call_in_an_unlisted_namespace_is_forbidden_and_its_models_untouched(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    as_operator = cluster.api(OPERATOR)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}
    made = as_operator.status_of("POST", f"/api/v1/namespaces/{TENANT}/configmaps",
                                 {**config_map, "metadata": {"name": "probe-write"}})
    assert made == 201
    assert as_operator.status_of("POST", f"/api/v1/namespaces/{OTHER}/configmaps",
                                 {**config_map, "metadata": {"name": "probe-write"}}) == 403
    assert as_operator.status_of("GET", f"/api/v1/namespaces/{OTHER}/pods") == 403
    assert as_operator.status_of("GET", f"{LM}/localmodels") == 403
    # A model in the unlisted namespace is not the operator's: no status, nothing
    # made, while a model applied after it in a listed namespace is reconciled.
    apply(cluster, GOOD.named("elsewhere", OTHER).manifest())
    apply(cluster, GOOD.named("after").manifest())
    wait_condition(cluster, TENANT, "after", "Valid", "True", timeout=90)
    elsewhere = cluster.api().get(f"{LM}/namespaces/{OTHER}/localmodels/elsewhere")
    assert not (elsewhere.get("status") or {}).get("conditions")  # (the CRD defaults the rest)
    assert made_for(cluster, OTHER, "elsewhere") == []
    assert operator.alive()
