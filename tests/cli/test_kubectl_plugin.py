"""`kubectl localmodel`'s pure part: the objects read become the status table
and the `why` story (the real kubectl runs it in tests/e2e/test_day2.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from localmodel.api import parse_local_model
from localmodel.desired import desired_state
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.slots import SlotSnapshot
from localmodel.kubectl import main
from localmodel.kubectl_views import state_of, status_rows, status_table, why_data, why_text
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

NOW = "2026-12-01T00:00:00Z"
NODES = [MakeNode(f"n{i}").cpus(8).memory_gib(32).cpu_flags({"AVX2"}).facts() for i in range(2)]


def stored(name: str, ready: dict[int, bool], **spec: Any) -> dict[str, Any]:
    """A LocalModel as the API server returns it after the operator's status write."""
    lm = parse_local_model({
        "apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
        "metadata": {"name": name, "namespace": "ai", "generation": 1},
        "spec": {"model": "qwen3:0.6b", "cpu": 2, "placement": {"exclusive": False}, **spec}})
    [r] = desired_state([lm], NODES, now=NOW, ready={lm.key: ready}).models
    out: dict[str, Any] = r.with_status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return out


def gateway_text(busy: int, fg: int, bg: int, tokens: float, seconds: float) -> str:
    m = GatewayMetrics(lambda: SlotSnapshot(total=2, busy=busy, queued_foreground=fg,
                                            queued_background=bg, queue_limit=8), lambda: busy)
    m.engine.generated_tokens.inc(tokens)
    m.engine.decode_seconds.inc(seconds)
    return m.render()


def test_status_has_a_row_per_replica_with_node_threads_speed_and_queue() -> None:
    two = stored("chat", {0: True, 1: True}, replicas=2)
    pods = [p["pod"] for p in two["status"]["placements"]]
    rows = status_rows([two], {f"ai/{pods[0]}": gateway_text(1, 3, 1, 600.0, 20.0),
                               f"ai/{pods[1]}": ConnectionError("503 Service Unavailable")})
    assert [(r.replica, r.pod) for r in rows] == [(0, pods[0]), (1, pods[1])]
    first, second = rows
    assert first.node in ("n0", "n1") and first.threads == 2
    assert (first.slots, first.queued, first.decode_tps) == ("1/2", "3+1", 30.0)
    assert first.state == "Ready=True: AllReplicasReady" and first.ready == "2/2"
    assert second.decode_tps is None and second.metrics_error == "503 Service Unavailable"
    text = status_table(rows, all_namespaces=False)
    header, line0, line1 = text.splitlines()[:3]
    assert header.split() == ["NAME", "MODEL", "ENGINE", "READY", "REPLICA", "NODE", "THREADS",
                              "SLOTS", "QUEUE", "TOK/S", "EXPECTED", "STATE"]
    assert line0.split()[:10] == ["chat", "qwen3:0.6b", "ollama", "2/2", "0", first.node, "2",
                                  "1/2", "3+1", "30.0"]
    assert line1.split()[9] == "?" and f"ai/{pods[1]}: 503 Service Unavailable" in text
    assert status_table(rows, all_namespaces=True).splitlines()[1].split()[0] == "ai"


def test_a_model_without_replicas_is_one_row_saying_why() -> None:
    big = stored("big", {}, cpu=64)
    [row] = status_rows([big], {})
    assert row.replica is None and row.node is None
    assert row.state == "Stalled: NoFeasibleNode"
    assert state_of({"metadata": {"generation": 2}, "status": {"observedGeneration": 0}}) == (
        "Pending: not yet seen by the operator")


def test_why_lists_every_decision_with_rule_effect_reason_and_source() -> None:
    obj = stored("chat", {0: False})
    data = why_data(obj)
    [placement] = data["placements"]
    decisions = obj["status"]["placements"][0]["decisions"]
    assert decisions and placement["decisions"] == [
        {k: d[k] for k in ("rule", "effect", "reason", "source")} for d in decisions]
    assert data["state"] == "Reconciling: ReplicasNotReady"
    text = why_text(obj, [{"type": "Normal", "reason": "Placed", "message": "replica 0 placed",
                           "lastTimestamp": NOW}])
    assert "RULE" in text and "SOURCE" in text
    for d in decisions:
        line = next(x for x in text.splitlines() if x.startswith(d["rule"]))
        assert d["effect"] in line and d["source"] in line
    assert f"{NOW}  Normal  Placed: replica 0 placed" in text
    assert "Reconciling" in text


def test_bad_arguments_exit_2_naming_them(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["status", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err
    assert main(["why", "x", "--context", "c"]) == 2  # no kubeconfig to hold a context
    assert "--context c" in capsys.readouterr().err


def test_the_namespace_is_the_contexts_as_kubectl_reads_it(tmp_path: Any) -> None:
    from localmodel.kube import KubeconfigError, kubeconfig_namespace

    cluster = {"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}
    user = {"name": "u", "user": {"token": "t"}}
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": [user],
              "contexts": [{"name": "plain", "context": {"cluster": "c", "user": "u"}},
                           {"name": "team", "context": {"cluster": "c", "user": "u",
                                                        "namespace": "models"}}],
              "current-context": "team"}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert kubeconfig_namespace(str(path)) == "models"
    assert kubeconfig_namespace(str(path), "plain") == "default"
    with pytest.raises(KubeconfigError, match="nosuch"):
        kubeconfig_namespace(str(path), "nosuch")


def test_a_named_model_refuses_all_namespaces_as_kubectl_does(capsys: Any) -> None:
    for command in (["why", "chat"], ["timeline", "chat"]):
        assert main([*command, "-A"]) == 2
        err = capsys.readouterr().err
        assert f"kubectl localmodel {command[0]}: -A/--all-namespaces" in err
        assert "give -n NAMESPACE" in err


def test_timeline_takes_the_output_formats_its_command_prints(capsys: Any) -> None:
    from localmodel.timeline.cli import OUTPUTS

    assert OUTPUTS == ("table", "json", "yaml")
    with pytest.raises(SystemExit) as exc:
        main(["timeline", "chat", "-o", "wide"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument -o/--output: invalid choice: 'wide'" in err and "Traceback" not in err


def test_one_namespace_rule_for_every_command(tmp_path: Any) -> None:
    """-A, else -n, else the context's namespace; doctor alone defaults to the
    whole cluster."""
    from localmodel.kubectl import _cluster_flags, _namespace, _parser

    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "team", "context": {"cluster": "c", "user": "u",
                                                        "namespace": "models"}}],
              "current-context": "team"}
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(config))

    def scope(*argv: str) -> str | None:
        args, _ = _parser().parse_known_args([*argv, "--kubeconfig", str(kc)])
        return _namespace(args)

    table = [
        (["status"], "models"), (["status", "-n", "ai"], "ai"), (["status", "-A"], None),
        (["why", "x"], "models"), (["why", "x", "-n", "ai"], "ai"),
        (["timeline", "x"], "models"), (["timeline", "x", "-n", "ai"], "ai"),
        (["doctor"], None), (["doctor", "-n", "ai"], "ai"), (["doctor", "-A"], None),
        (["doctor", "-A", "-n", "ai"], None),
    ]
    assert [(argv, scope(*argv)) for argv, _ in table] == table
    args, _ = _parser().parse_known_args(["timeline", "x", "--kubeconfig", "k", "--context",
                                          "team"])
    assert _cluster_flags(args) == ["--kubeconfig", "k", "--context", "team"]
