"""`localmodel run` against a real control plane (etcd, kube-apiserver with an
audit log, controller-manager, scheduler, kwok), as the chart's identity.

Everything here is real except the nodes (kwok fakes kubelets: pods are bound
by the real scheduler, then marked Running/Ready by kwok; no container runs).
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.engines import ollama
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.chart import NAMESPACE
from tests.harness.cluster import OPERATOR_USER
from tests.harness.fixtures import operator_cluster, operator_running, tools_or_fail
from tests.harness.nodes import NodeShape, local_volume_manifests, node_manifest
from tests.harness.operator import OperatorProcess, chart_rbac, wait_condition
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "operator-nodes.yaml"
LM = "/apis/localmodel.dev/v1alpha1"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    with operator_cluster(tools_or_fail(), FIXTURE, audit=True) as c:
        yield c


@pytest.fixture(scope="module")
def operator(cluster: TestCluster) -> Iterator[OperatorProcess]:
    with operator_running(cluster, "operator-a", extra_args=("--unschedulable-seconds", "5")) as op:
        yield op


@pytest.fixture
def ns(cluster: TestCluster) -> Iterator[str]:
    with cluster.fresh_namespace("lm") as name:
        yield name


QWEN = MakeLocalModel("m").spec(model="qwen3:0.6b", cpu=2, context=4096,
                                storage={"retain": False, "size": "5Gi"})


def apply(cluster: TestCluster, *objs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objs)))


def get_lm(cluster: TestCluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.api().get(f"{LM}/namespaces/{ns}/localmodels/{name}")


def pods(cluster: TestCluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api().get(f"/api/v1/namespaces/{ns}/pods")["items"]
    return items


def claims(cluster: TestCluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api().get(
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims")["items"]
    return items


def container(pod: dict[str, Any], name: str = "ollama") -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def add_node(cluster: TestCluster, name: str, labels: dict[str, str], cpu: str = "8",
             volumes: tuple[str, ...] = ("50Gi", "50Gi")) -> None:
    shape = NodeShape(name=name, cpu=cpu, memory="32Gi", labels=labels, volumes=volumes)
    api = cluster.api()
    api.create("/api/v1/nodes", node_manifest(shape))
    for pv in local_volume_manifests(shape, "local-disk"):
        api.create("/api/v1/persistentvolumes", pv)


def delete_nodes(cluster: TestCluster, *names: str) -> None:
    for name in names:
        cluster.api().request("DELETE", f"/api/v1/nodes/{name}")


def writes_by(cluster: TestCluster, since: int = 0, user: str = OPERATOR_USER,
              namespace: str | None = None) -> list[dict[str, Any]]:
    """`user`'s writes after the first `since` of its requests; in `namespace` only,
    when given (the operator still reconciles what earlier tests left in their
    namespaces while those are deleted: a pod it re-creates there is refused)."""
    return [e for e in cluster.audit_events(user)[since:] if e["verb"] in WRITE_VERBS
            and (namespace is None or (e.get("objectRef") or {}).get("namespace") == namespace)]


# ---- acceptance ------------------------------------------------------------------


def test_applied_model_reaches_ready_and_explains_itself(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    apply(cluster, QWEN.named("qwen3", ns).spec(cpu=4, context=8192).manifest())
    wait = cluster.kubectl("wait", "--for=condition=Ready", "lm/qwen3", "-n", ns,
                           "--timeout=90s", check=False)
    assert wait.returncode == 0, (wait.stderr + operator.log_tail() + yaml.safe_dump(
        get_lm(cluster, ns, "qwen3").get("status")) + yaml.safe_dump(pods(cluster, ns)))
    wide = cluster.kubectl("get", "lm", "-n", ns, "-o", "wide").stdout.splitlines()
    header, row = wide[0].split(), wide[1].split()
    assert header[:8] == ["NAME", "MODEL", "ENGINE", "CPU", "CONTEXT", "READY", "NODES",
                          "STATUS"]
    assert row[:6] == ["qwen3", "qwen3:0.6b", "ollama", "4", "8192", "1/1"]
    assert row[6] and row[6] != "<none>" and row[7] == "AllReplicasReady"
    assert row[-1] == f"http://qwen3.{ns}.svc:{ollama.PORT}"
    describe = cluster.kubectl("describe", "lm", "qwen3", "-n", ns).stdout
    assert "threads" in describe.lower() and "Decisions" in describe
    assert "Placed" in describe and "replica 0 placed on node" in describe
    [pod] = pods(cluster, ns)
    engine = container(pod)
    limits, requests = engine["resources"]["limits"], engine["resources"]["requests"]
    assert limits == requests and limits["cpu"] == "4"  # Guaranteed, whole CPUs
    assert pod["status"].get("qosClass") == "Guaranteed"
    [claim] = claims(cluster, ns)
    assert claim["status"]["phase"] == "Bound"
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
               for v in pod["spec"]["volumes"])


def _decisions(lm: dict[str, Any]) -> set[str]:
    return {d["rule"] for p in lm["status"]["placements"] for d in p["decisions"]}


def test_amx_guard_only_where_the_rules_say_and_threads_follow_the_limit(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """An Ollama build the AMX rule treats as affected: its guard fires on the AMX
    node only; on both, the engine's threads equal the CPU limit; `cpu: node`
    takes the node's free whole CPUs (minus the gateway's share)."""
    from localmodel.api import parse_local_model
    from localmodel.desired import desired_state
    from localmodel.facts.node import from_node

    amx = {"node.kubernetes.io/instance-type": "sapphire-rapids-32"}
    avx2 = {"node.kubernetes.io/instance-type": "avx2-8"}
    image = {"image": "docker.io/ollama/ollama:0.30.0"}
    apply(cluster,
          QWEN.named("on-amx", ns).spec(cpu=3, engine=image, placement={"nodeSelector": amx})
          .manifest(),
          QWEN.named("on-avx2", ns).spec(cpu=3, engine=image, placement={"nodeSelector": avx2})
          .manifest(),
          QWEN.named("whole", ns).spec(cpu="node", placement={"nodeSelector": {
              "node.kubernetes.io/instance-type": "small-3"}}).manifest())
    for name in ("on-amx", "on-avx2", "whole"):
        wait_condition(cluster, ns, name, "Ready", timeout=90)
    on_amx, on_avx2 = get_lm(cluster, ns, "on-amx"), get_lm(cluster, ns, "on-avx2")
    # What the pure rules say for these very nodes:
    nodes = {n["metadata"]["name"]: from_node(n)
             for n in cluster.api().get("/api/v1/nodes")["items"]}
    for lm in (on_amx, on_avx2):
        [placement] = lm["status"]["placements"]
        parsed = parse_local_model({k: v for k, v in lm.items() if k != "status"})
        [offline] = desired_state([parsed], [nodes[placement["node"]]], now="x").models
        assert {d.rule for d in offline.replicas[0].tuning.decisions} == _decisions(lm)
    amx_only = _decisions(on_amx) - _decisions(on_avx2)
    assert any("amx" in rule for rule in amx_only), amx_only
    for pod in pods(cluster, ns):
        engine = container(pod)
        threads = pod["metadata"]["annotations"]["localmodel.dev/threads"]
        assert threads == engine["resources"]["limits"]["cpu"]
    [whole] = [p for p in pods(cluster, ns) if p["metadata"]["name"].startswith("whole-")]
    # small-3: 3 CPUs, the gateway takes 250m, so the engine gets 2 whole CPUs.
    assert container(whole)["resources"]["limits"]["cpu"] == "2"
    assert get_lm(cluster, ns, "whole")["status"]["placements"][0]["threads"] == 2


def test_extra_exclusive_models_wait_with_reasons_and_a_new_node_places_them(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    sel = {"localmodel.dev/pool": f"p-{ns}"}
    add_node(cluster, f"{ns}-a", sel)
    try:
        apply(cluster, *(QWEN.named(f"m{i}", ns).spec(placement={"nodeSelector": sel}).manifest()
                         for i in range(2)))
        placed = [wait_condition(cluster, ns, f"m{i}", "Placed", status=s, timeout=60)
                  for i, s in ((0, "True"), (1, "False"))]
        [cond] = [c for c in placed[1]["status"]["conditions"] if c["type"] == "Placed"]
        assert cond["reason"] in ("NoFeasibleNode", "NoMatchingNode")
        assert f"{ns}-a" in cond["message"], cond["message"]  # per-node reason
        events = cluster.kubectl("get", "events", "-n", ns,
                                 "--field-selector", "involvedObject.name=m1").stdout
        assert "Unplaced" in events
        add_node(cluster, f"{ns}-b", sel)
        lm1 = wait_condition(cluster, ns, "m1", "Ready", timeout=60)
        assert lm1["status"]["nodes"] == f"{ns}-b"
    finally:
        delete_nodes(cluster, f"{ns}-a", f"{ns}-b")


def test_deleted_node_replaces_its_model_with_a_new_claim(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    sel = {"localmodel.dev/pool": f"p-{ns}"}
    add_node(cluster, f"{ns}-a", sel)
    add_node(cluster, f"{ns}-b", sel)
    try:
        apply(cluster, QWEN.named("mover", ns).spec(placement={"nodeSelector": sel},
                                                    storage={"retain": True, "size": "5Gi"})
              .manifest())
        lm = wait_condition(cluster, ns, "mover", "Ready", timeout=60)
        first = lm["status"]["nodes"]
        [claim] = claims(cluster, ns)
        wait_until("the claim to bind", lambda: cluster.api().get(
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim['metadata']['name']}"
        )["status"].get("phase") == "Bound", timeout=30)
        cluster.api().request("DELETE", f"/api/v1/nodes/{first}")

        def moved() -> bool:
            got = get_lm(cluster, ns, "mover")["status"]
            running = [p for p in pods(cluster, ns) if not p["metadata"].get("deletionTimestamp")]
            return (got.get("nodes") not in ("", first) and got.get("readyReplicas") == 1
                    and len(running) == 1 and running[0]["spec"].get("nodeName") != first)

        wait_until("the model to move", moved, timeout=90)
        names = sorted(c["metadata"]["name"] for c in claims(cluster, ns))
        assert names == ["mover-weights-0", "mover-weights-0-1"]  # retained one kept
        [pod] = pods(cluster, ns)
        assert pod["spec"]["nodeName"] != first
        used = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                if "persistentVolumeClaim" in v]
        assert used == ["mover-weights-0-1"]
        events = cluster.kubectl("get", "events", "-n", ns).stdout
        assert "Moved" in events and "CreatedClaim" in events
        # retain flipped off: the claim in use becomes owned (collected with the
        # model); the one retained on the gone node's volume stays retained.
        apply(cluster, QWEN.named("mover", ns).spec(placement={"nodeSelector": sel},
                                                    storage={"retain": False, "size": "5Gi"})
              .manifest())

        def owners() -> dict[str, list[str]]:
            return {c["metadata"]["name"]: [o["uid"] for o in
                                            c["metadata"].get("ownerReferences") or []]
                    for c in claims(cluster, ns)}

        wait_until("the claim in use to become owned", lambda: owners() == {
            "mover-weights-0": [], "mover-weights-0-1": [lm["metadata"]["uid"]]}, timeout=60)
    finally:
        delete_nodes(cluster, f"{ns}-a", f"{ns}-b")


def test_a_pod_left_unschedulable_moves_its_replica_to_the_next_node(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """The planner cannot see free local volumes; the scheduler can. The smaller
    node (best fit) has no volume left: its pod stays Unschedulable, and after
    --unschedulable-seconds the replica moves to the next eligible node."""
    sel = {"localmodel.dev/pool": f"p-{ns}"}
    add_node(cluster, f"{ns}-novol", sel, cpu="4", volumes=())
    add_node(cluster, f"{ns}-vol", sel, cpu="8")
    try:
        apply(cluster, QWEN.named("stuck", ns).spec(placement={"nodeSelector": sel}).manifest())
        wait_until("the first placement on the node without volumes", lambda: get_lm(
            cluster, ns, "stuck").get("status", {}).get("nodes") == f"{ns}-novol", timeout=60)
        lm = wait_condition(cluster, ns, "stuck", "Ready", timeout=90)
        assert lm["status"]["nodes"] == f"{ns}-vol"
        events = cluster.kubectl("get", "events", "-n", ns,
                                 "--field-selector", "involvedObject.name=stuck").stdout
        assert "Unschedulable" in events and f"{ns}-novol" in events
    finally:
        delete_nodes(cluster, f"{ns}-novol", f"{ns}-vol")


def test_a_pod_waits_for_a_claim_the_api_refused(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """A ResourceQuota that allows no claims refuses the weights claim: the pod
    that would mount it is not created (the scheduler would leave it Pending on
    a claim that does not exist), ApplyFailed names the refusal, and once the
    quota is gone the retry makes the claim, then the pod."""
    api = cluster.api()
    api.create(f"/api/v1/namespaces/{ns}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-claims", "namespace": ns},
        "spec": {"hard": {"persistentvolumeclaims": "0"}}})
    apply(cluster, QWEN.named("quota", ns).spec(cpu=1, placement={"exclusive": False}).manifest())

    def refused() -> bool:
        events = cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                                 "involvedObject.name=quota,reason=ApplyFailed").stdout
        return "quota" in events

    wait_until("ApplyFailed for the refused claim", refused, timeout=60)
    assert claims(cluster, ns) == []
    assert pods(cluster, ns) == [], "a pod was created without its claim"
    api.request("DELETE", f"/api/v1/namespaces/{ns}/resourcequotas/no-claims")
    wait_condition(cluster, ns, "quota", "Ready", timeout=120)
    assert [c["metadata"]["name"] for c in claims(cluster, ns)] == ["quota-weights-0"]


def test_update_rolls_one_replica_at_a_time_and_scale_down_removes_the_top(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    spec = {"replicas": 3, "placement": {"exclusive": False}, "cpu": 1}
    apply(cluster, QWEN.named("roll", ns).spec(**spec).manifest())
    wait_condition(cluster, ns, "roll", "Ready", timeout=90)
    before = {p["metadata"]["annotations"]["localmodel.dev/pod-spec-hash"]
              for p in pods(cluster, ns)}
    since = len(cluster.audit_events())
    apply(cluster, QWEN.named("roll", ns).spec(**{**spec, "context": 2048}).manifest())

    def rolled() -> bool:
        got = get_lm(cluster, ns, "roll")
        ctx = {c["status"] for c in got["status"]["conditions"] if c["type"] == "Progressing"}
        ps = pods(cluster, ns)
        hashes = {p["metadata"]["annotations"]["localmodel.dev/pod-spec-hash"] for p in ps}
        return (ctx == {"False"} and len(ps) == 3 and not hashes & before
                and got["status"].get("readyReplicas") == 3)

    wait_until("the roll to finish", rolled, timeout=120)
    writes = writes_by(cluster, since, namespace=ns)
    deletes = [e for e in writes if e["verb"] == "delete" and e["objectRef"]["resource"] == "pods"]
    creates = [e for e in writes if e["verb"] == "create" and e["objectRef"]["resource"] == "pods"]
    order = sorted(deletes + creates, key=lambda e: e["requestReceivedTimestamp"])
    # delete r, create r, delete r', create r', ...: never two replicas down at once
    kinds = [e["verb"] for e in order]
    assert kinds == ["delete", "create"] * 3, [
        (e["verb"], e["objectRef"]["name"], e["responseStatus"]["code"]) for e in order]
    assert len({e["objectRef"]["name"] for e in deletes}) == 3
    apply(cluster,
          QWEN.named("roll", ns).spec(**{**spec, "context": 2048, "replicas": 1}).manifest())
    wait_until("scale down", lambda: sorted(p["metadata"]["name"] for p in pods(cluster, ns)
                                            if not p["metadata"].get("deletionTimestamp"))
               == ["roll-0"], timeout=60)
    wait_condition(cluster, ns, "roll", "Ready", timeout=60)
    wait_until("unretained claims of removed replicas to go",
               lambda: sorted(c["metadata"]["name"] for c in claims(cluster, ns)
                              if not c["metadata"].get("deletionTimestamp"))
               == ["roll-weights-0"], timeout=60)
    # Without the gateway the Service targets the engine port directly.
    apply(cluster, QWEN.named("roll", ns).spec(**{**spec, "context": 2048, "replicas": 1,
                                        "gateway": {"enabled": False}}).manifest())
    wait_until("the Service to target the engine", lambda: cluster.api().get(
        f"/api/v1/namespaces/{ns}/services/roll")["spec"]["ports"][0]["targetPort"]
        == "engine", timeout=60)


def test_an_object_the_operator_cannot_use_is_marked_and_others_still_reconcile(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """A catalog-unknown model with memory: auto passes the API server but not the
    operator: Valid=False naming the field, an Event, and the next model still works."""
    apply(cluster, QWEN.named("unknown", ns).spec(model="nosuch/model:7b").manifest())
    bad = wait_condition(cluster, ns, "unknown", "Valid", status="False", timeout=60)
    [valid] = [c for c in bad["status"]["conditions"] if c["type"] == "Valid"]
    assert "spec." in valid["message"], valid["message"]
    apply(cluster, QWEN.named("good", ns).manifest())
    wait_condition(cluster, ns, "good", "Ready", timeout=60)
    assert operator.alive()
    events = cluster.kubectl("get", "events", "-n", ns,
                             "--field-selector", "involvedObject.name=unknown").stdout
    assert "InvalidSpec" in events


def test_idle_operator_writes_nothing_but_its_lease(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    idle = QWEN.spec(cpu=1, placement={"exclusive": False})
    apply(cluster, *(idle.named(f"idle{i}", ns).manifest() for i in range(20)))
    for i in range(20):
        wait_condition(cluster, ns, f"idle{i}", "Ready", timeout=120)
    time.sleep(5)  # let the last status writes and events land
    since = len(cluster.audit_events())
    time.sleep(120)
    writes = writes_by(cluster, since)
    others = [e for e in writes if e["objectRef"].get("resource") != "leases"]
    leases = [e for e in writes if e["objectRef"].get("resource") == "leases"]
    print(f"\nidle 120 s with 20 Ready models: {len(others)} writes besides "
          f"{len(leases)} Lease renewals")
    assert others == [], [(e["verb"], e["objectRef"]) for e in others[:10]]
    assert all(e["verb"] == "update" for e in leases)


def test_two_replicas_only_the_leader_writes_and_a_crash_fails_over(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    second = OperatorProcess(cluster, identity="operator-b", extra_args=operator.extra_args)
    second.start()
    try:
        lease = cluster.api().get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}"
                                  "/leases/localmodel-operator")
        assert lease["spec"]["holderIdentity"] == "operator-a"
        since = len(cluster.audit_events())
        apply(cluster, QWEN.named("both", ns).manifest())
        wait_condition(cluster, ns, "both", "Ready", timeout=60)
        # The audit log names the user (both replicas share it); the user agent
        # names the replica.
        agents = [e.get("userAgent", "") for e in writes_by(cluster, since)
                  if e["objectRef"].get("resource") != "leases"]
        assert agents, "the leader wrote nothing"
        assert all("(operator-a)" in a for a in agents), set(agents)
        assert "localmodel_operator_api_writes_total{" not in _non_lease(second.metrics())
        assert leads(operator) and not leads(second)
        operator.kill()
        began = time.monotonic()
        wait_until("the follower to take over", lambda: leads(second), timeout=30)
        failover = time.monotonic() - began
        print(f"\nfailover after SIGKILL: {failover:.1f} s")
        assert failover < 20
        apply(cluster, QWEN.named("after", ns).manifest())
        wait_condition(cluster, ns, "after", "Ready", timeout=60)
    finally:
        second.stop()
        if not operator.alive():
            operator.start()


def leads(op: OperatorProcess) -> bool:
    return "localmodel_operator_leader 1" in op.metrics().splitlines()


def _non_lease(metrics: str) -> str:
    return "\n".join(line for line in metrics.splitlines()
                     if line.startswith("localmodel_operator_api_writes_total{")
                     and 'kind="Lease"' not in line)


def test_chaos_sigkill_during_a_burst_converges(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """SIGKILL the operator 20 times at random points during creates, updates and
    deletes; restart it each time. At the end: every model converged, no replica
    has two pods, nothing orphaned, no retained claim gone."""
    rng = random.Random(7)
    names = [f"c{i}" for i in range(8)]
    live: dict[str, dict[str, Any]] = {}
    retained_seen: set[str] = set()
    for round_ in range(20):
        action = rng.choice(["create", "create", "update", "delete"])
        if action == "create" or not live:
            name = rng.choice(names)
            live[name] = QWEN.named(name, ns).spec(
                cpu=1, placement={"exclusive": False},
                storage={"retain": rng.random() < 0.5, "size": "2Gi"},
                replicas=rng.choice([1, 2])).manifest()
            apply(cluster, live[name])
        elif action == "update":
            name = rng.choice(sorted(live))
            live[name]["spec"]["context"] = rng.choice([2048, 4096, 8192])
            live[name]["spec"]["replicas"] = rng.choice([1, 2, 3])
            apply(cluster, live[name])
        else:
            name = rng.choice(sorted(live))
            del live[name]
            cluster.kubectl("delete", "lm", name, "-n", ns, "--wait=false")
        for c in claims(cluster, ns):
            if not c["metadata"].get("ownerReferences"):
                retained_seen.add(c["metadata"]["name"])
        time.sleep(rng.uniform(0.0, 1.5))
        operator.kill()
        operator.start(wait_ready=round_ % 5 == 4)
    wait_until("the last operator to be ready", operator.ready, timeout=60)
    for name in sorted(live):
        wait_condition(cluster, ns, name, "Ready", timeout=180)

    def settled() -> bool:
        ps = [p for p in pods(cluster, ns) if not p["metadata"].get("deletionTimestamp")]
        want = {f"{n}-{r}" for n, m in live.items() for r in range(m["spec"]["replicas"])}
        return {p["metadata"]["name"] for p in ps} == want

    wait_until("exactly the wanted pods", settled, timeout=120)
    ps = pods(cluster, ns)
    per_replica = [(p["metadata"]["labels"]["localmodel.dev/name"],
                    p["metadata"]["labels"]["localmodel.dev/replica"]) for p in ps]
    assert len(per_replica) == len(set(per_replica)), "a replica has two pods"
    uids = {get_lm(cluster, ns, n)["metadata"]["uid"] for n in live}
    for p in ps:  # nothing orphaned: every pod belongs to a live model
        assert p["metadata"]["ownerReferences"][0]["uid"] in uids
    now_claims = {c["metadata"]["name"] for c in claims(cluster, ns)}
    assert retained_seen <= now_claims, f"retained claims lost: {retained_seen - now_claims}"
    print(f"\nchaos: {operator.starts} operator starts, {len(live)} models live, "
          f"{len(retained_seen)} retained claims kept")


def test_a_models_network_policy_is_created_updated_turned_off_and_goes_with_it(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """spec.gateway.networkPolicy (render/policy.py) against the real API
    server: created with the model (its inference port open to the namespaces
    named, its admin port to the operator's), updated when they change,
    deleted when turned off, and gone with the model (garbage collection)."""
    path = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
    spec = {"cpu": 1, "placement": {"exclusive": False}}

    def model(**policy: Any) -> dict[str, Any]:
        return QWEN.named("guarded", ns).spec(
            **spec, gateway={"networkPolicy": policy}).manifest()

    def policies() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cluster.api().get(path)["items"]
        return items

    def callers() -> list[str] | None:
        found = policies()
        if len(found) != 1:
            return None
        return [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                for peer in found[0]["spec"]["ingress"][0]["from"]]

    apply(cluster, model(enabled=True, namespaces=["apps"], podLabels={"role": "client"}))
    wait_until("the NetworkPolicy", lambda: callers() == ["apps"], timeout=60)
    [policy] = policies()
    lm_uid = get_lm(cluster, ns, "guarded")["metadata"]["uid"]
    assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [lm_uid]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"localmodel.dev/name": "guarded"}}
    inference, admin = policy["spec"]["ingress"]
    assert inference["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert inference["from"][0]["podSelector"] == {"matchLabels": {"role": "client"}}
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in admin["from"]] == [NAMESPACE]
    apply(cluster, model(enabled=True, namespaces=["apps", "web"]))
    wait_until("the NetworkPolicy updated", lambda: callers() == ["apps", "web"], timeout=60)
    apply(cluster, model(enabled=False))
    wait_until("the NetworkPolicy deleted", lambda: policies() == [], timeout=60)
    apply(cluster, model(enabled=True))  # no namespaces named: the model's own
    wait_until("the NetworkPolicy again", lambda: callers() == [ns], timeout=60)
    cluster.kubectl("delete", "lm", "guarded", "-n", ns)
    wait_until("the NetworkPolicy gone with the model", lambda: policies() == [], timeout=60)


def test_rbac_granted_is_exactly_what_the_operator_used(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    """Runs after the others in this module: compares every (group, resource, verb)
    in the audit log with the chart's rules, both ways."""
    used: set[tuple[str, str, str]] = set()
    for e in cluster.audit_events():
        ref = e.get("objectRef") or {}
        if not ref.get("resource"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, e["verb"]))
    granted: set[tuple[str, str, str]] = set()
    for obj in chart_rbac(cluster):
        for rule in obj.get("rules", []):
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        granted.add((g, r, v))
    # 403s that are not RBAC: creates in a namespace being deleted (the tests
    # delete theirs while the operator still reconciles what was in it), and
    # claims a ResourceQuota refused (test_a_pod_waits_for_a_claim_the_api_refused).
    denied = [e for e in cluster.audit_events() if e["responseStatus"]["code"] == 403
              and "being terminated" not in e["responseStatus"].get("message", "")
              and "quota" not in e["responseStatus"].get("message", "")]
    assert not denied, [(e["verb"], e["objectRef"]) for e in denied[:5]]
    assert used - granted == set(), "used but not granted"
    assert granted - used == set(), "granted but never used"


def test_localmodel_run_without_credentials_fails_clearly(tmp_path: Path) -> None:
    import os
    import sys

    from tests.harness.tools import REPO_ROOT

    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["PYTHONPATH"] = str(REPO_ROOT / "operator")
    out = subprocess.run([sys.executable, "-m", "localmodel.cli", "run",
                          "--kubeconfig", str(tmp_path / "missing")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "missing" in out.stderr and "Traceback" not in out.stderr


# ---- llama-server ------------------------------------------------------------------

GGUF = {
    "url": "https://models.example/gemma-3-270m-q4_k_m.gguf",
    "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}


def test_llama_server_model_reaches_ready_with_the_same_kind_of_decisions(
    cluster: TestCluster, operator: OperatorProcess, ns: str
) -> None:
    """engine.name: llama-server through the operator: Ready, its pod as the
    renderer makes it (flags from the CPU limit and the slots, the download
    init step, Guaranteed), and status decisions of the same kind as an Ollama
    model's next to it."""
    apply(cluster,
          QWEN.named("gemma", ns).spec(model="gemma3:270m", cpu=2, context=4096, slots=2,
                                       engine={"name": "llama-server"}, gguf=GGUF).manifest(),
          QWEN.named("qwen", ns).spec(cpu=2).manifest())
    for name in ("gemma", "qwen"):
        wait_condition(cluster, ns, name, "Ready", timeout=90)
    gemma, qwen = get_lm(cluster, ns, "gemma"), get_lm(cluster, ns, "qwen")
    shared = {"threads-from-cpu-limit", "memory-from-weights-and-kv", "guaranteed-qos",
              "weights-volume"}
    assert shared <= _decisions(gemma) & _decisions(qwen)
    assert {"llama-server-context-per-slot", "llama-server-metrics"} <= _decisions(gemma)
    assert not {"one-model-per-pod"} & _decisions(gemma)
    [placement] = gemma["status"]["placements"]
    assert (placement["threads"], placement["cpu"]) == (2, 2)
    assert all(d["reason"] and d["source"] for d in placement["decisions"])
    [pod] = [p for p in pods(cluster, ns) if p["metadata"]["name"].startswith("gemma-")]
    engine = container(pod, "llama-server")
    args = engine["args"]
    assert args[:4] == ["-t", "2", "-tb", "2"]
    assert args[args.index("-c") + 1] == "8192" and args[args.index("-np") + 1] == "2"
    assert placement["settings"]["args"] == " ".join(args)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["download"]
    assert pod["status"].get("qosClass") == "Guaranteed"
    row = next(r.split() for r in cluster.kubectl("get", "lm", "-n", ns).stdout.splitlines()
               if r.startswith("gemma "))
    assert row[2] == "llama-server" and "1/1" in row
