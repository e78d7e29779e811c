"""Day two on a real control plane (kwok nodes, `localmodel run` as the chart's
identity): what GitOps tools say about a LocalModel, and `kubectl localmodel`.

Health: every version of three LocalModels, as a watch delivers them, goes
through kstatus (sigs.k8s.io/cli-utils, what Flux uses) and through the Argo CD
health check docs/gitops/localmodel-health.lua run in gopher-lua, both in
`lmhealth` (hack/lmhealth, built by hack/build-tools.sh): a model created and
rolled (InProgress, then Current), one with a spec the operator refuses and one
no node can take (Failed). The two agree on every version.

The plugin: installed from this checkout's pyproject.toml (its console script)
into a directory on PATH, found by the real `kubectl plugin list`, and run as
`kubectl localmodel ...` with --kubeconfig, --context, -n, -A and -o.

`timeline` reads gateways' ledgers: kwok runs no containers, so through the
API server's pod proxy every ledger is unreadable here, and the test asserts
what the user is told. The ledger's data path is tested with a REAL
`localmodel gateway` in front of a REAL llama-server read by `--gateway-url`
(the override a person uses after `kubectl port-forward`); through the pod
proxy on the real node in tests/realnode/test_timeline_on_node.py.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.gateway_contract import ADMIN_PORT
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.engines import llama_server
from tests.harness.fixtures import operator_cluster, operator_running, tools_or_fail
from tests.harness.operator import OperatorProcess, wait_condition
from tests.harness.plugin import install_plugin, run_kubectl, shown_seconds
from tests.harness.processes import (
    ManagedProcess,
    free_port,
    http_ok,
    localmodel_process,
    wait_until,
)
from tests.harness.tools import REPO_ROOT, TOOL_NAMES

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "operator-nodes.yaml"
LUA = REPO_ROOT / "docs" / "gitops" / "localmodel-health.lua"
LM = "/apis/localmodel.dev/v1alpha1"
# kstatus's verdicts and the Argo CD health status that says the same.
ARGO_OF = {"InProgress": "Progressing", "Current": "Healthy", "Failed": "Degraded",
           "Terminating": "Progressing"}
# Set to a directory to keep the watched objects (tests/fixtures/gitops/ was made so).
RECORD = os.environ.get("LOCALMODEL_RECORD_HEALTH", "")


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    with operator_cluster(tools_or_fail((*TOOL_NAMES, "lmhealth")), FIXTURE) as c:
        yield c


@pytest.fixture(scope="module")
def operator(cluster: TestCluster) -> Iterator[OperatorProcess]:
    with operator_running(cluster, "operator-day2", log_lines=20) as op:
        yield op


QWEN = MakeLocalModel("m").spec(model="qwen3:0.6b", cpu=1, context=4096,
                                placement={"exclusive": False},
                                storage={"retain": False, "size": "5Gi"})


def apply(cluster: TestCluster, *objs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objs)))


def lmhealth(cluster: TestCluster, text: str) -> list[dict[str, Any]]:
    """kstatus's and the Lua check's verdict on every object in `text` (JSON)."""
    assert cluster.tools is not None
    out = subprocess.run([str(cluster.tools["lmhealth"]), "-lua", str(LUA)], input=text,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@dataclass
class Scenario:
    ns: str
    verdicts: list[dict[str, Any]]  # per watched version, in order

    def of(self, name: str) -> list[dict[str, Any]]:
        return [v for v in self.verdicts if v["name"] == name]


@pytest.fixture(scope="module")
def scenario(cluster: TestCluster, operator: OperatorProcess) -> Scenario:
    """A roll, an invalid spec and an unplaceable model, every version watched."""
    ns = f"day2-{secrets.token_hex(3)}"
    cluster.api().create("/api/v1/namespaces", {"metadata": {"name": ns}})
    assert cluster.tools is not None
    watched = cluster.workdir / "logs" / f"watch-{ns}.json"
    watch = ManagedProcess("kubectl get -w", [
        str(cluster.tools["kubectl"]), "--kubeconfig", str(cluster.admin_kubeconfig),
        "get", "localmodels", "-n", ns, "-w", "-o", "json"], watched,
        err_path=cluster.workdir / "logs" / f"watch-{ns}.err")
    watch.start()
    try:
        spec = {"replicas": 2}
        apply(cluster, QWEN.named("roll", ns).spec(**spec).manifest())
        wait_condition(cluster, ns, "roll", "Ready", timeout=90)
        apply(cluster, QWEN.named("roll", ns).spec(**{**spec, "context": 2048}).manifest())

        def rolled() -> bool:
            got = cluster.api().get(f"{LM}/namespaces/{ns}/localmodels/roll")
            st = got.get("status") or {}
            progressing = {c["status"] for c in st.get("conditions") or []
                           if c["type"] == "Progressing"}
            return (st.get("observedGeneration") == 2 and progressing == {"False"}
                    and st.get("readyReplicas") == 2)

        wait_until("the roll to finish", rolled, timeout=120)
        apply(cluster, QWEN.named("invalid", ns).spec(model="nosuch/model:7b").manifest())
        wait_condition(cluster, ns, "invalid", "Stalled", timeout=60)
        apply(cluster, QWEN.named("unplaceable", ns).spec(cpu=64).manifest())
        wait_condition(cluster, ns, "unplaceable", "Stalled", timeout=60)
        # The watch has shown the last writes when the verdicts stop changing.
        wait_until("the watch to catch up", lambda: sum(
            1 for v in lmhealth(cluster, watched.read_text())
            if v["name"] == "unplaceable" and v["kstatus"]["status"] == "Failed") > 0,
            timeout=30, interval=0.5)
    finally:
        watch.stop()
    text = watched.read_text()
    if RECORD:
        Path(RECORD).mkdir(parents=True, exist_ok=True)
        (Path(RECORD) / "watched.json").write_text(text)
    return Scenario(ns=ns, verdicts=lmhealth(cluster, text))


# ---- GitOps health ---------------------------------------------------------------


def test_kstatus_and_the_argo_cd_check_agree_on_every_version(scenario: Scenario) -> None:
    assert len(scenario.verdicts) >= 8, scenario.verdicts
    for v in scenario.verdicts:
        assert v["lua"]["status"] == ARGO_OF[v["kstatus"]["status"]], v


def test_a_new_model_is_in_progress_until_ready_then_current(scenario: Scenario) -> None:
    roll = scenario.of("roll")
    first = roll[0]
    # Before the operator's first write the CRD's default says "not observed yet".
    assert first["kstatus"]["status"] == "InProgress", first
    assert "observed generation is 0" in first["kstatus"]["message"], first
    gen1 = [v["kstatus"]["status"] for v in roll if v["generation"] == 1]
    assert gen1[-1] == "Current" and "Failed" not in gen1, gen1


def test_a_roll_is_in_progress_from_the_edit_to_the_last_ready_pod(scenario: Scenario) -> None:
    gen2 = [v for v in scenario.of("roll") if v["generation"] == 2]
    statuses = [v["kstatus"]["status"] for v in gen2]
    assert statuses[0] == "InProgress" and statuses[-1] == "Current", statuses
    assert "Failed" not in statuses
    # Not only the generation check: the operator's own Reconciling condition,
    # with the roll's story, once it has observed the edit.
    rolling = [v for v in gen2 if v["kstatus"]["status"] == "InProgress"
               and "generation" not in v["kstatus"]["message"]]
    assert rolling, gen2
    assert all(v["lua"]["message"].startswith(("RollingUpdate", "ReplicasNotReady"))
               for v in rolling), rolling


@pytest.mark.parametrize(("name", "reason"), [("invalid", "InvalidSpec"),
                                              ("unplaceable", "NoFeasibleNode")])
def test_a_model_the_operator_cannot_run_is_failed(scenario: Scenario, name: str,
                                                   reason: str) -> None:
    versions = scenario.of(name)
    last = versions[-1]
    assert last["kstatus"]["status"] == "Failed", versions
    assert last["lua"] == {"status": "Degraded", "message": f"{reason}: "
                           + last["kstatus"]["message"]}, last
    assert "Current" not in [v["kstatus"]["status"] for v in versions]


def test_a_list_from_the_cluster_gets_the_same_verdicts(cluster: TestCluster,
                                                        scenario: Scenario) -> None:
    listed = cluster.kubectl("get", "localmodels", "-n", scenario.ns, "-o", "json").stdout
    got = {v["name"]: (v["kstatus"]["status"], v["lua"]["status"])
           for v in lmhealth(cluster, listed)}
    assert got == {"roll": ("Current", "Healthy"), "invalid": ("Failed", "Degraded"),
                   "unplaceable": ("Failed", "Degraded")}


# ---- kubectl localmodel ------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PATH with the plugin installed from pyproject.toml (no dependencies: the
    test environment has them) in front."""
    return install_plugin(tmp_path_factory.mktemp("plugin"))


def kubectl(cluster: TestCluster, path: str, *args: str, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    """The real kubectl, as a user runs it, with the plugin on PATH (and this
    checkout's code first on PYTHONPATH, over the installed copy's)."""
    assert cluster.tools is not None
    out = run_kubectl(cluster.tools["kubectl"], path, *args)
    if check:
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out


def test_kubectl_plugin_list_finds_the_plugin(cluster: TestCluster, plugin_path: str) -> None:
    out = kubectl(cluster, plugin_path, "plugin", "list", check=False)
    found = [line for line in out.stdout.splitlines() if line.endswith("/kubectl-localmodel")]
    first_on_path = plugin_path.split(os.pathsep)[0]
    assert found and found[0] == f"{first_on_path}/kubectl-localmodel", out.stdout + out.stderr
    # kubectl exits 1 on warnings: the only one allowed is another install of this
    # plugin further down PATH (e.g. `pip install -e .` into the environment).
    if out.returncode != 0:
        warnings = [w for w in out.stderr.splitlines() if w.strip().startswith("- warning")]
        assert warnings and all("overshadowed" in w for w in warnings), out.stderr


def test_status_shows_every_model_replica_node_and_threads(
    cluster: TestCluster, scenario: Scenario, plugin_path: str
) -> None:
    kc = str(cluster.admin_kubeconfig)
    out = kubectl(cluster, plugin_path, "localmodel", "status", "--kubeconfig", kc,
                  "-n", scenario.ns).stdout
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "MODEL", "ENGINE"], out
    roll = cluster.api().get(f"{LM}/namespaces/{scenario.ns}/localmodels/roll")
    for p in roll["status"]["placements"]:
        row = next(line.split() for line in lines
                   if line.split()[:1] == ["roll"] and line.split()[4] == str(p["replica"]))
        assert row[3] == "2/2" and row[5] == p["node"] and row[6] == str(p["threads"]), row
    assert any(line.startswith("invalid") and "Stalled: InvalidSpec" in line for line in lines)
    assert any(line.startswith("unplaceable") and "Stalled: NoFeasibleNode" in line
               for line in lines)
    # kwok runs no containers: no gateway answers, and the table says so.
    assert "metrics unreadable" in out

    everywhere = json.loads(kubectl(cluster, plugin_path, "localmodel", "status", "-A",
                                    "-o", "json", "--kubeconfig", kc).stdout)
    assert {(r["namespace"], r["model"]) for r in everywhere} >= {
        (scenario.ns, "roll"), (scenario.ns, "invalid"), (scenario.ns, "unplaceable")}


def test_context_and_its_namespace_are_honoured(
    cluster: TestCluster, scenario: Scenario, plugin_path: str, tmp_path: Path
) -> None:
    """--context picks another context of the kubeconfig; with no -n, its namespace."""
    config = yaml.safe_load(cluster.admin_kubeconfig.read_text())
    base = config["contexts"][0]
    config["contexts"].append({"name": "day2", "context": {**base["context"],
                                                           "namespace": scenario.ns}})
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(config))
    rows = json.loads(kubectl(cluster, plugin_path, "localmodel", "status", "--kubeconfig",
                              str(kc), "--context", "day2", "-o", "json").stdout)
    assert {r["model"] for r in rows} == {"roll", "invalid", "unplaceable"}
    assert {r["namespace"] for r in rows} == {scenario.ns}
    bad = kubectl(cluster, plugin_path, "localmodel", "status", "--kubeconfig", str(kc),
                  "--context", "nosuch", check=False)
    assert bad.returncode == 2 and "nosuch" in bad.stderr


def test_why_tells_the_decisions_and_what_blocks_a_model(
    cluster: TestCluster, scenario: Scenario, plugin_path: str
) -> None:
    kc = str(cluster.admin_kubeconfig)
    roll = cluster.api().get(f"{LM}/namespaces/{scenario.ns}/localmodels/roll")
    text = kubectl(cluster, plugin_path, "localmodel", "why", "roll", "-n", scenario.ns,
                   "--kubeconfig", kc).stdout
    assert "RULE" in text and "EFFECT" in text and "SOURCE" in text, text
    for p in roll["status"]["placements"]:
        assert f"Replica {p['replica']} on node {p['node']}" in text
        for d in p["decisions"]:
            assert any(line.startswith(d["rule"]) and d["source"] in line
                       for line in text.splitlines()), (d, text)
    data = yaml.safe_load(kubectl(cluster, plugin_path, "localmodel", "why", "roll", "-n",
                                  scenario.ns, "--kubeconfig", kc, "-o", "yaml").stdout)
    assert [d["rule"] for d in data["placements"][0]["decisions"]] == [
        d["rule"] for d in roll["status"]["placements"][0]["decisions"]]
    blocked = kubectl(cluster, plugin_path, "localmodel", "why", "unplaceable", "-n",
                      scenario.ns, "--kubeconfig", kc).stdout
    assert "State: Stalled: NoFeasibleNode" in blocked and "Unplaced" in blocked, blocked
    missing = kubectl(cluster, plugin_path, "localmodel", "why", "nosuch", "-n", scenario.ns,
                      "--kubeconfig", kc, check=False)
    assert missing.returncode == 1 and f"LocalModel {scenario.ns}/nosuch not found" in (
        missing.stderr)


def test_doctor_and_render_run_against_the_same_cluster(
    cluster: TestCluster, scenario: Scenario, plugin_path: str, tmp_path: Path
) -> None:
    kc = str(cluster.admin_kubeconfig)
    doctor = kubectl(cluster, plugin_path, "localmodel", "doctor", "--kubeconfig", kc,
                     "-o", "json", check=False)
    assert doctor.returncode in (0, 1, 2), doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["findings"], report
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(QWEN.named("offline").namespace(scenario.ns).spec(cpu=4).manifest()))
    rendered = list(yaml.safe_load_all(kubectl(
        cluster, plugin_path, "localmodel", "render", "--kubeconfig", kc, "-f",
        str(manifest)).stdout))
    [lm] = [o for o in rendered if o and o.get("kind") == "LocalModel"]
    assert any(o and o.get("kind") == "Pod" for o in rendered)
    node_names = {n["metadata"]["name"] for n in cluster.api().get("/api/v1/nodes")["items"]}
    # Placed on one of the cluster's (kwok) nodes, not on this machine.
    assert lm["status"]["nodes"] in node_names, lm["status"]


def test_doctor_n_scopes_it_to_one_namespace(
    cluster: TestCluster, scenario: Scenario, plugin_path: str
) -> None:
    """-n: the models of that namespace only (the scenario's, on kwok: their
    pods are found, their gateways unreadable); -A, like no -n, the whole cluster."""
    kc = str(cluster.admin_kubeconfig)
    other = f"day2-other-{secrets.token_hex(3)}"
    cluster.api().create("/api/v1/namespaces", {"metadata": {"name": other}})
    apply(cluster, QWEN.named("elsewhere", other).manifest())
    wait_condition(cluster, other, "elsewhere", "Ready", timeout=90)

    def report(*scope: str) -> dict[str, Any]:
        out = kubectl(cluster, plugin_path, "localmodel", "doctor", "--kubeconfig", kc,
                      "-o", "json", *scope, check=False)
        assert out.returncode in (0, 1, 2) and "Traceback" not in out.stderr, out.stderr
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def pods_named(data: dict[str, Any], ns: str) -> bool:
        return any(f"{ns}/" in f["message"] for f in data["findings"]
                   if f["check"] in ("queue", "threads"))

    scoped = report("-n", scenario.ns)
    assert scoped["facts"]["namespace"] == scenario.ns
    assert scoped["facts"]["model_pods"] == 2  # roll's two replicas
    assert pods_named(scoped, scenario.ns) and not pods_named(scoped, other)
    for whole in (report(), report("-A")):
        assert "namespace" not in whole["facts"]
        assert whole["facts"]["model_pods"] >= 3
        assert pods_named(whole, scenario.ns) and pods_named(whole, other)


def test_timeline_says_what_it_cannot_read_and_why(
    cluster: TestCluster, scenario: Scenario, plugin_path: str, tmp_path: Path
) -> None:
    kc = str(cluster.admin_kubeconfig)
    ns = scenario.ns

    def timeline(*args: str) -> subprocess.CompletedProcess[str]:
        out = kubectl(cluster, plugin_path, "localmodel", "timeline", *args, check=False)
        print(f"kubectl localmodel timeline {' '.join(args)}: exit {out.returncode}\n"
              f"{out.stderr}")
        assert out.returncode != 0 and out.stdout == "", out.stdout
        assert "Traceback" not in out.stderr, out.stderr
        return out

    missing = timeline("nosuch", "-n", ns, "--kubeconfig", kc)
    assert missing.returncode == 2
    assert missing.stderr == f"localmodel timeline: LocalModel {ns}/nosuch not found\n"

    unplaced = timeline("unplaceable", "-n", ns, "--kubeconfig", kc)
    assert f"LocalModel {ns}/unplaceable has no scheduled pods" in unplaced.stderr
    assert f"kubectl localmodel why unplaceable -n {ns}" in unplaced.stderr

    # kwok runs no containers: the pod proxy reaches no gateway, and says so.
    roll = cluster.api().get(f"{LM}/namespaces/{ns}/localmodels/roll")
    pods = {p["pod"] for p in roll["status"]["placements"]}
    unreachable = timeline("roll", "-n", ns, "--kubeconfig", kc)
    assert unreachable.returncode == 2
    [line] = unreachable.stderr.splitlines()
    named = [pod for pod in pods if f"reading pod {ns}/{pod}'s ledger through the API "
             f"server's pod proxy (port {ADMIN_PORT}): " in line]
    assert len(named) == 1, line
    assert f"kubectl port-forward -n {ns} pod/{named[0]} {ADMIN_PORT}" in line

    nogw_ns = f"day2-nogw-{secrets.token_hex(3)}"
    cluster.api().create("/api/v1/namespaces", {"metadata": {"name": nogw_ns}})
    apply(cluster, QWEN.named("nogw", nogw_ns).spec(gateway={"enabled": False}).manifest())
    wait_condition(cluster, nogw_ns, "nogw", "Ready", timeout=90)
    nogw = timeline("nogw", "-n", nogw_ns, "--kubeconfig", kc)
    assert "runs without the gateway, which keeps the ledger" in nogw.stderr
    assert "spec.gateway.enabled: true" in nogw.stderr

    # Like `kubectl get NAME -A`: a name needs a namespace.
    everywhere = timeline("roll", "-A", "--kubeconfig", kc)
    assert everywhere.returncode == 2 and "-A/--all-namespaces" in everywhere.stderr
    bad = timeline("roll", "-n", ns, "--kubeconfig", kc, "-o", "wide")
    assert bad.returncode == 2
    assert "argument -o/--output: invalid choice: 'wide'" in bad.stderr

    # --context: that context's cluster and, with no -n, its namespace.
    config = yaml.safe_load(cluster.admin_kubeconfig.read_text())
    config["contexts"].append({"name": "timeline", "context": {
        **config["contexts"][0]["context"], "namespace": ns}})
    other = tmp_path / "kubeconfig"
    other.write_text(yaml.safe_dump(config))
    in_context = timeline("nosuch", "--kubeconfig", str(other), "--context", "timeline")
    assert f"LocalModel {ns}/nosuch not found" in in_context.stderr
    no_context = timeline("roll", "--kubeconfig", str(other), "--context", "nosuch")
    assert no_context.returncode == 2 and "nosuch" in no_context.stderr
    # No gateway at the URL given: named, with the reason.
    port = free_port()
    refused = timeline("roll", "--gateway-url", f"http://127.0.0.1:{port}")
    assert f"localmodel timeline: http://127.0.0.1:{port}/ledger?since=2h: " in refused.stderr


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _chat(url: str, caller: str, max_tokens: int, *, background: bool = False
          ) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "X-LocalModel-Caller": caller}
    if background:
        headers["X-Priority"] = "background"
    body = {"model": "gemma", "max_tokens": max_tokens, "stream": False, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count from 1 to 500."}]}
    request = urllib.request.Request(f"{url}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


@pytest.mark.engine  # a real llama-server behind the gateway
@pytest.mark.llama
def test_timeline_reads_a_real_gateways_ledger_through_kubectl(
    cluster: TestCluster, plugin_path: str, tmp_path: Path
) -> None:
    """A background job holds the only slot of a real gateway (one llama-server
    slot, one thread) while a foreground question waits: `kubectl localmodel
    timeline --gateway-url` reports that wait behind the job, with the ledger's
    own numbers, in every -o format."""
    one_thread = ["-c", "2048", "-np", "1", "-t", "1", "--no-warmup"]
    with llama_server(tmp_path, one_thread) as engine:
        port, admin = free_port(), free_port()
        url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "operator")}
        gateway = localmodel_process(
            "gateway", ["gateway", "--upstream", engine.url, "--engine", "llama-server",
                        "--listen", f"127.0.0.1:{port}", "--admin-listen",
                        f"127.0.0.1:{admin}", "--slots", "1", "--model", "gemma"],
            tmp_path / "gateway.log", env=env)
        with gateway.serving("the gateway /readyz", lambda: http_ok(f"{url}/readyz"), 60):
            job = threading.Thread(target=_chat, args=(url, "indexer", 48),
                                   kwargs={"background": True})
            job.start()
            wait_until("the job to hold the slot", lambda: _get(f"{url}/slots")["busy"] == 1,
                       timeout=60, interval=0.05)
            _chat(url, "alice", 4)
            job.join(timeout=300)
            entries = _get(f"{admin_url}/ledger")["entries"]

            def run(*output: str) -> str:
                return kubectl(cluster, plugin_path, "localmodel", "timeline", "chat",
                               "--gateway-url", admin_url, "--since", "1h", *output).stdout

            data = json.loads(run("-o", "json"))
            assert yaml.safe_load(run("-o", "yaml")) == data
            table = run()
    [alice] = [e for e in entries if e["caller"] == "alice"]
    [behind] = alice["waited_behind"]
    assert behind["caller"] == "indexer" and behind["priority"] == "background"
    assert behind["seconds"] > 0
    assert data["requests"] == 2 and data["foreground"] == 1 and data["background"] == 1
    assert data["queueing"]["behind"] == [
        {"caller": "indexer", "priority": "background", "seconds": round(behind["seconds"], 3)}]
    [slowest] = data["slowest"]
    assert slowest["caller"] == "alice"
    assert slowest["queue_s"] == round(alice["queue_wait_s"], 3)
    print("\n" + table)
    assert table.startswith(f"Where the time went: chat at {admin_url}, since 1h: 2 requests "
                            "(1 foreground, 1 background)")
    assert shown_seconds(table, "indexer (background)") == pytest.approx(behind["seconds"],
                                                                         abs=0.06)
    order = [table.index(f"{n}. ") for n in range(1, 7)]
    assert order == sorted(order)
