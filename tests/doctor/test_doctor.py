"""doctor's pure checks: the cluster scenario, one machine, metrics, output, exit status."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localmodel.doctor.checks import EngineView, local_findings
from localmodel.doctor.cluster import ClusterView, cluster_findings
from localmodel.doctor.metrics import MetricsError, gateway_stats, parse_metrics
from localmodel.doctor.report import Finding, Report, Verdict, exit_status, render_table, to_json
from localmodel.engine_pods import engine_pods
from localmodel.engines import llama_server, ollama
from localmodel.engines.doctor import LoadedModel
from localmodel.engines.llama_server.doctor import threads_from_command_line
from localmodel.facts.machine import read_machine
from localmodel.facts.node import from_node_list
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.record import Outcome, RequestRecord
from localmodel.gateway.slots import SlotSnapshot
from localmodel.gateway_contract.timing import EngineTiming
from tests.harness.doctor_scenario import chat_pod_key, scenario_pods
from tests.harness.nodes import load_fixture, node_manifest

pytestmark = pytest.mark.unit

TREES = Path(__file__).resolve().parents[1] / "fixtures" / "machines"


def gateway_text(queued: int = 2, background_rejected: int = 3) -> str:
    """What the real gateway's metrics code renders after some traffic."""
    snapshot = SlotSnapshot(total=1, busy=1, queued_foreground=queued, queued_background=0,
                            queue_limit=16)
    metrics = GatewayMetrics(lambda: snapshot, lambda: 1 + queued)
    for i in range(background_rejected):
        rec = RequestRecord(request_id=f"b{i}", route="/api/chat", priority="background", start=0)
        rec.finish(Outcome.REJECTED_BUSY, 429)
        metrics.record(rec)
    done = RequestRecord(request_id="f", route="/api/chat", priority="foreground", start=0,
                         slot_at=0.0, slot_released_at=10.0)
    done.timing = EngineTiming(prompt_tokens=400, prompt_seconds=2.0, generated_tokens=96,
                               decode_seconds=8.0)
    done.finish(Outcome.OK, 200)
    metrics.record(done)
    return metrics.render()


def nodes_and_manifests() -> tuple[list[dict[str, object]], list[object]]:
    manifests = [node_manifest(shape) for shape in load_fixture().nodes]
    for manifest in manifests:  # as the API returns them once kwok reports status
        manifest.setdefault("status", {})
    return manifests, from_node_list(manifests)  # type: ignore[return-value]


def scenario_view(metrics_text: str | Exception | None = None) -> ClusterView:
    manifests, nodes = nodes_and_manifests()
    pods = scenario_pods(nodes, "shop", amx_node="amx-0")  # type: ignore[arg-type]
    metrics = {} if metrics_text is None else {chat_pod_key(pods): metrics_text}
    return ClusterView(nodes=manifests, pods=pods, metrics=metrics)  # type: ignore[arg-type]


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def test_cluster_scenario_has_each_finding_with_its_fix() -> None:
    facts, findings = cluster_findings(scenario_view(gateway_text()))
    assert facts["model_pods"] == 4 and facts["gateways"] == 1

    [two] = [f for f in by_check(findings, "models-per-node") if f.verdict is not Verdict.OK]
    assert "node avx2-0 holds 2 models" in two.message
    assert "shop/stray" in two.message and "context 32768" in two.message
    assert "exceed the node's 8 CPUs" in two.message  # 4 + 8 threads on 8 CPUs
    assert two.verdict is Verdict.FAIL and "move or stop shop/stray" in two.fix

    [queue] = by_check(findings, "queue")
    assert queue.verdict is Verdict.WARN
    assert "1/1 slots busy, 2 foreground waiting, 3 background turned away" in queue.message
    assert "spec.replicas" in queue.fix
    # ... and names the command that shows whom they waited behind.
    assert "`localmodel timeline chat -n shop` shows whom they waited behind" in queue.fix

    cancel = {f.message.split(" ")[0]: f for f in by_check(findings, "cancellation")}
    assert set(cancel) == {"shop/nogw-0", "shop/stray", "shop/amx-legacy"}
    assert "spec.gateway.enabled: true on LocalModel shop/nogw" in cancel["shop/nogw-0"].fix
    assert "localmodel gateway" in cancel["shop/stray"].fix

    [speed] = by_check(findings, "speed")
    assert "decode 12.0 tok/s" in speed.message and "prefill 200.0 tok/s" in speed.message

    [amx] = by_check(findings, "amx")
    assert amx.verdict is Verdict.FAIL and "AMX node amx-0 (Ollama 0.31.0)" in amx.message
    # 0.31.0: deleting the crashing variant is the workaround; OLLAMA_LLM_LIBRARY
    # does not choose a CPU variant there (docs/engine-facts.md#ollama_llm_library).
    assert "0.32.2" in amx.fix and "libggml-cpu-sapphirerapids.so" in amx.fix
    assert "cpu_avx2" not in amx.fix

    order = [f.check for f in findings]
    assert order.index("models-per-node") < order.index("queue") < order.index("cancellation")
    assert order.index("cancellation") < order.index("speed") < order.index("amx")
    assert exit_status(findings) == 2


def test_unreadable_gateway_metrics_are_a_warning_naming_the_override() -> None:
    _, findings = cluster_findings(scenario_view(OSError("503 Service Unavailable")))
    [queue] = by_check(findings, "queue")
    assert queue.verdict is Verdict.WARN and "503" in queue.message
    assert "--metrics-url shop/chat-0=URL" in queue.fix


def test_guarded_and_fixed_ollama_on_amx_are_ok() -> None:
    view = scenario_view(gateway_text())
    pods = [p for p in view.pods if p["metadata"]["name"] == "amx-legacy"]
    [pod] = pods
    guarded = json.loads(json.dumps(pod))
    guarded["metadata"]["name"] = "amx-guarded"
    guarded["spec"]["containers"][0]["env"] += [
        {"name": "OLLAMA_LLM_LIBRARY", "value": "cpu_avx2"},
        {"name": "OLLAMA_FLASH_ATTENTION", "value": "0"},
    ]
    guarded["spec"]["containers"][0]["image"] = "docker.io/ollama/ollama:0.24.0"
    removed = json.loads(json.dumps(pod))
    removed["metadata"]["name"] = "amx-removed"
    removed["spec"]["containers"][0]["image"] = "docker.io/ollama/ollama:0.31.0"
    removed["spec"]["containers"][0]["command"] = [
        "/bin/sh",
        "-c",
        "rm -f /usr/lib/ollama/libggml-cpu-sapphirerapids.so; exec /bin/ollama serve",
    ]
    fixed = json.loads(json.dumps(pod))
    fixed["metadata"]["name"] = "amx-fixed"
    fixed["spec"]["containers"][0]["image"] = "docker.io/ollama/ollama:0.32.2"
    _, findings = cluster_findings(replace(view, pods=[guarded, removed, fixed]))
    verdicts = {f.message.split(" ")[0]: f.verdict for f in by_check(findings, "amx")}
    assert verdicts == {
        "shop/amx-guarded": Verdict.OK,
        "shop/amx-removed": Verdict.OK,
        "shop/amx-fixed": Verdict.OK,
    }


def test_nodes_with_neither_nfd_nor_probe_labels_are_unknown_and_said_so() -> None:
    manifests, _ = nodes_and_manifests()
    bare = json.loads(json.dumps(manifests[0]))
    bare["metadata"]["name"] = "bare-0"
    bare["metadata"]["labels"] = {"kubernetes.io/hostname": "bare-0"}
    _, findings = cluster_findings(ClusterView(nodes=[*manifests, bare], pods=[]))
    [unknown] = by_check(findings, "node-facts")
    assert unknown.verdict is Verdict.WARN and "bare-0" in unknown.message
    assert "safe path" in unknown.message and "probe.enabled=true" in unknown.fix


def test_engine_pods_skip_finished_and_unscheduled_pods() -> None:
    view = scenario_view()
    done = json.loads(json.dumps(view.pods[-1]))
    done["status"] = {"phase": "Succeeded"}
    pending = json.loads(json.dumps(view.pods[-1]))
    del pending["spec"]["nodeName"]
    assert engine_pods([done, pending]) == []


def test_metrics_parse_the_gateways_own_text() -> None:
    stats = gateway_stats(parse_metrics(gateway_text(queued=0, background_rejected=0)))
    assert (stats.slots, stats.slots_busy, stats.queued_foreground) == (1, 1, 0)
    assert stats.decode_tps == pytest.approx(12.0)
    with pytest.raises(MetricsError, match="line 1"):
        parse_metrics("not metrics at all {")
    with pytest.raises(MetricsError, match="not the localmodel gateway"):
        gateway_stats(parse_metrics("other_metric 1\n"))


LLAMA_8 = EngineView(
    url=f"http://127.0.0.1:{llama_server.PORT}",
    kind="llama-server",
    models=(LoadedModel("gemma.gguf", context=2048),),
    slots=1,
    context_per_slot=2048,
    threads=8,
    threads_source="command line of pid 42",
    pid=42,
    process_budget=1.0,
    process_budget_why="pid 42: cgroup quota 1 CPUs",
)


def test_local_eight_threads_on_one_cpu_fail_with_the_fix_naming_one() -> None:
    machine = read_machine(TREES / "recorded-2cpu-v1-quota1")
    findings = local_findings(machine, LLAMA_8)
    [budget] = by_check(findings, "cpu-budget")
    assert "CPU budget 1 (2 host CPUs, cgroup quota 1 CPUs)" in budget.message
    [threads] = by_check(findings, "threads")
    assert threads.verdict is Verdict.FAIL and "runs 8 threads" in threads.message
    assert threads.fix == "start it with --threads 1 (-t 1)"
    [cancel] = by_check(findings, "cancellation")
    assert cancel.verdict is Verdict.WARN and "localmodel gateway" in cancel.fix


def test_local_threads_matching_the_budget_are_ok_and_smt_numa_advice_is_sourced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = read_machine(TREES / "smt-2numa-v2-quota")
    # This process's CPUs as in the tree (0-3,8-11): four cores, both threads of each.
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9, 10, 11})
    engine = replace(LLAMA_8, threads=4, process_budget=4.5, process_budget_why="quota 4.5")
    findings = local_findings(machine, engine)
    [threads] = by_check(findings, "threads")
    assert threads.verdict is Verdict.OK
    assert by_check(findings, "smt") == []  # 4 threads on 4 cores: no SMT sharing
    spread = replace(engine, threads=4, process_budget=8.0)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 4, 8, 12})
    findings = local_findings(machine, spread)
    [numa] = by_check(findings, "numa")
    assert "span NUMA nodes 0, 1" in numa.message and "#13850" in numa.message
    [smt] = by_check(findings, "smt")  # cpus 0,8 and 4,12 are two cores, 4 threads
    assert "4 threads on 2 physical cores" in smt.message and "#19110" in smt.message


def test_local_llama_server_without_threads_uses_host_cores() -> None:
    machine = read_machine(TREES / "recorded-2cpu-v1-quota1")
    findings = local_findings(machine, replace(LLAMA_8, threads=None))
    [threads] = by_check(findings, "threads")
    assert threads.verdict is Verdict.FAIL and "default (2" in threads.message
    assert threads.fix == "start it with --threads 1"


def test_local_two_loaded_models_warn() -> None:
    machine = read_machine(TREES / "recorded-2cpu-v1")
    engine = EngineView(url=f"http://127.0.0.1:{ollama.PORT}", kind="ollama", version="0.32.2",
                        models=(LoadedModel("a", 2**30, 8192), LoadedModel("b", 2**31)))
    [models] = by_check(local_findings(machine, engine), "models-per-node")
    assert models.verdict is Verdict.WARN and "2 models hold weights" in models.message


def test_unreachable_engine_still_reports_the_budget() -> None:
    machine = read_machine(TREES / "recorded-2cpu-v1")
    findings = local_findings(machine, EngineView(url="http://x:1", error="refused"))
    assert [f.check for f in findings] == ["engine", "cpu-budget", "amx"]


@pytest.mark.parametrize(
    ("argv", "env", "threads"),
    [
        (["llama-server", "-m", "m.gguf", "-t", "8"], {}, 8),
        (["llama-server", "--threads=3"], {}, 3),
        (["llama-server", "--threads", "2", "-tb", "9"], {"LLAMA_ARG_THREADS": "5"}, 2),
        (["llama-server"], {"LLAMA_ARG_THREADS": "5"}, 5),
        (["llama-server", "-t", "-1"], {}, None),
        (["llama-server"], {}, None),
    ],
)
def test_threads_from_command_line(
    argv: list[str], env: dict[str, str], threads: int | None
) -> None:
    assert threads_from_command_line(argv, env) == threads


@pytest.mark.parametrize(
    ("verdicts", "strict", "status"),
    [
        ([], False, 0),
        ([Verdict.OK], True, 0),
        ([Verdict.OK, Verdict.WARN], False, 0),
        ([Verdict.WARN], True, 1),
        ([Verdict.WARN, Verdict.FAIL], False, 2),
        ([Verdict.FAIL], True, 2),
    ],
)
def test_exit_status(verdicts: list[Verdict], strict: bool, status: int) -> None:
    assert exit_status([Finding("x", v, "m") for v in verdicts], strict=strict) == status


def test_json_and_table_carry_every_finding() -> None:
    report = Report(
        facts={"cpu_budget": 1.0, "host_cpus": 2, "memory_bytes": 2**30},
        findings=[Finding("threads", Verdict.FAIL, "8 threads on 1 CPU", "use 1 thread")],
    )
    data = json.loads(to_json(report))
    assert data["facts"]["cpu_budget"] == 1.0
    assert data["findings"] == [
        {"check": "threads", "verdict": "fail", "message": "8 threads on 1 CPU",
         "fix": "use 1 thread"}
    ]
    table = render_table(report)
    assert "memory_bytes  1Gi" in table
    assert "fail     threads  8 threads on 1 CPU" in table
    assert "fix: use 1 thread" in table


def test_doctor_without_a_cluster_says_which_configuration_it_tried(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from localmodel.cli import main

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert "in-cluster configuration (no --kubeconfig, no KUBECONFIG)" in err
    missing = tmp_path / "nope.yaml"
    assert main(["doctor", "--kubeconfig", str(missing)]) == 2
    assert f"kubeconfig {missing}" in capsys.readouterr().err


def test_doctor_rejects_a_malformed_metrics_url(capsys: pytest.CaptureFixture[str]) -> None:
    from localmodel.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--metrics-url", "chat-0=http://x"])
    assert exit_info.value.code == 2
    assert "expected NAMESPACE/POD=URL" in capsys.readouterr().err


def test_numa_nodes_from_the_probes_annotation() -> None:
    from localmodel.facts.node import PROBE_FACTS_ANNOTATION
    from localmodel.probe.node import desired_metadata

    # avx2-0 (8 CPUs) carries the probe's facts of a two-socket machine with NUMA
    # nodes of 8 CPUs; the chat pod's 4 threads fit, a 12-thread pod would not.
    _, annotations = desired_metadata(read_machine(TREES / "smt-2numa-v2-quota"))
    view = scenario_view()
    nodes = json.loads(json.dumps(view.nodes))
    for n in nodes:
        if n["metadata"]["name"] == "avx2-0":
            n["metadata"].setdefault("annotations", {}).update(annotations)
    assert PROBE_FACTS_ANNOTATION in annotations
    _, findings = cluster_findings(replace(view, nodes=nodes))
    numa = {f.message.split(" ")[0]: f for f in by_check(findings, "numa")}
    assert numa["shop/chat-0"].verdict is Verdict.OK
    assert "2 NUMA nodes of 8 CPUs" in numa["shop/chat-0"].message
    assert numa["shop/stray"].verdict is Verdict.OK  # 8 CPUs: fits exactly
    wide = json.loads(json.dumps([p for p in view.pods if p["metadata"]["name"] == "stray"]))
    wide[0]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "12"
    _, findings = cluster_findings(replace(view, nodes=nodes, pods=wide))
    [too_wide] = by_check(findings, "numa")
    assert too_wide.verdict is Verdict.WARN and "cannot fit in one NUMA node" in too_wide.message
    assert "at most 8 CPUs" in too_wide.fix


def test_a_namespace_scopes_the_models_but_not_what_shares_their_nodes() -> None:
    """-n: the pods and gateways of one namespace; a node holding one of them
    is still checked with every model it holds, whatever its namespace."""
    view = scenario_view(gateway_text())
    pods = json.loads(json.dumps(view.pods))
    stray = next(p for p in pods if p["metadata"]["name"] == "stray")
    stray["metadata"]["namespace"] = "other"
    view = replace(view, pods=pods)

    def scoped(namespace: str | None) -> tuple[dict[str, Any], list[Finding]]:
        return cluster_findings(replace(view, namespace=namespace))

    # Whole cluster: as before, with other/stray among the pods.
    facts, every = scoped(None)
    assert facts["model_pods"] == 4 and "namespace" not in facts
    assert {f.message.split(" ")[0] for f in by_check(every, "cancellation")} == {
        "shop/nogw-0", "other/stray", "shop/amx-legacy"}

    facts, shop = scoped("shop")
    assert facts["model_pods"] == 3 and facts["gateways"] == 1 and facts["namespace"] == "shop"
    [two] = [f for f in by_check(shop, "models-per-node") if f.verdict is not Verdict.OK]
    assert "node avx2-0 holds 2 models" in two.message and "other/stray" in two.message
    assert {f.message.split(" ")[0] for f in by_check(shop, "cancellation")} == {
        "shop/nogw-0", "shop/amx-legacy"}
    assert len(by_check(shop, "queue")) == 1

    facts, other = scoped("other")
    assert facts["model_pods"] == 1 and facts["gateways"] == 0
    [two] = [f for f in by_check(other, "models-per-node") if f.verdict is not Verdict.OK]
    assert "shop/chat-0" in two.message  # the node other/stray contends for
    assert not by_check(other, "queue") and not by_check(other, "speed")
    assert [f.message.split(" ")[0] for f in by_check(other, "cancellation")] == ["other/stray"]
    assert not any("amx-legacy" in f.message for f in other)

    facts, nowhere = scoped("nowhere")
    assert facts["model_pods"] == 0
    assert [f.verdict for f in by_check(nowhere, "models-per-node")] == [Verdict.OK]
    # Nodes belong to no namespace: their facts are checked whatever the scope.
    assert by_check(nowhere, "node-facts") == by_check(every, "node-facts")
