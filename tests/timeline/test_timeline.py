"""`localmodel timeline`'s report (pure): the field report in miniature, as
ledger entries the gateway's own code writes, read back into the causes in
the field's order. The same scenario against the real llama-server is
tests/gateway/test_ledger_engine.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localmodel.cli import main
from localmodel.gateway_contract import Behind, LedgerEntry
from localmodel.timeline.cli import expired_at_router
from localmodel.timeline.report import Sharing, parts, render_table, timeline

pytestmark = pytest.mark.unit

BASE = LedgerEntry(
    request_id="r", caller="c", session=None, priority="foreground", route="/v1/chat/completions",
    model="m", outcome="ok", status=200, served_by="local", arrival=1000.0, duration=None,
    queue_wait=0.0, slot_start=0.0, slot_seconds=None, ttft=None, caller_gone=None,
    abandoned_seconds=None, behind=(), prompt_tokens=None, cached_tokens=None,
    evaluated_tokens=None, prefill_seconds=None, generated_tokens=None, decode_seconds=None,
    rewrite=None, reread_tokens=None, reread_seconds=None,
)


def field_report() -> list[dict[str, Any]]:
    """Abandoned background retries, a session compacted twice, and a question
    that waited behind the background work."""
    bg = replace(BASE, caller="indexer", priority="background", outcome="cancelled_disconnect",
                 status=499)
    session = replace(BASE, caller="agent", session="s1", rewrite=False, reread_tokens=0,
                      reread_seconds=0.0)
    entries = [
        replace(bg, request_id="b1", arrival=1000.0, duration=30.0, slot_seconds=30.0,
                caller_gone=30.0, abandoned_seconds=0.01),
        replace(bg, request_id="b2", arrival=1031.0, duration=30.0, slot_seconds=30.0,
                caller_gone=30.0, abandoned_seconds=0.02),
        replace(session, request_id="s-1", arrival=1100.0, duration=5.0, slot_seconds=5.0,
                prompt_tokens=500, cached_tokens=0, evaluated_tokens=500, prefill_seconds=2.0,
                generated_tokens=60, decode_seconds=2.9),
        replace(session, request_id="s-2", arrival=1110.0, duration=4.0, slot_seconds=4.0,
                prompt_tokens=900, cached_tokens=560, evaluated_tokens=340,
                prefill_seconds=1.0, generated_tokens=60, decode_seconds=2.9),
        replace(session, request_id="s-3", arrival=1120.0, duration=6.0, slot_seconds=6.0,
                prompt_tokens=700, cached_tokens=20, evaluated_tokens=680, prefill_seconds=3.0,
                generated_tokens=60, decode_seconds=2.9, rewrite=True, reread_tokens=680,
                reread_seconds=3.0),
        replace(session, request_id="s-4", arrival=1130.0, duration=6.5, slot_seconds=6.5,
                prompt_tokens=650, cached_tokens=20, evaluated_tokens=630, prefill_seconds=2.8,
                generated_tokens=60, decode_seconds=3.6, rewrite=True, reread_tokens=630,
                reread_seconds=2.8),
        replace(BASE, request_id="q", caller="alice", arrival=1040.0, duration=30.0,
                queue_wait=21.0, slot_start=21.0, slot_seconds=9.0, prompt_tokens=40,
                cached_tokens=0, evaluated_tokens=40, prefill_seconds=0.2,
                generated_tokens=200, decode_seconds=8.7,
                behind=(Behind("indexer", "background", 21.0),)),
    ]
    return [e.as_json() for e in entries]


def test_the_causes_come_in_the_fields_order_with_their_numbers() -> None:
    doc = timeline(field_report(), Sharing(["shop/stray (ollama) on node n1"]))
    assert (doc["requests"], doc["foreground"], doc["background"]) == (7, 5, 2)
    assert doc["queueing"]["behind"] == [
        {"caller": "indexer", "priority": "background", "seconds": 21.0}
    ]
    abandoned = doc["abandoned"]
    assert abandoned["requests"] == 2
    assert abandoned["held_before_gone_s"] == pytest.approx(59.97)
    assert abandoned["held_after_gone_s"] == pytest.approx(0.03)
    rereads = doc["rereads"]
    assert (rereads["rewrites"], rereads["seconds"]) == (2, 5.8)
    assert rereads["sessions"] == [
        {"caller": "agent", "session": "s1", "rewrites": 2, "seconds": 5.8, "tokens": 1310,
         "unknown": 0}
    ]
    # Prefill besides re-reads: 2.0 + 1.0 + 0.2 (+ 3.0 + 2.8 re-read).
    assert doc["prefill"]["seconds"] == pytest.approx(3.2)
    assert doc["prefill"]["cached_tokens"] == 600
    # The cancelled background work never reached the engine's final timing.
    assert doc["decode"] == {"seconds": pytest.approx(21.0), "tokens": 440, "unknown": 2}
    [slowest, *_] = doc["slowest"]
    assert slowest["request_id"] == "q" and slowest["queue_s"] == 21.0

    text = render_table(doc, "shop/chat")
    order = [text.index(f"{n}. ") for n in range(1, 8)]
    assert order == sorted(order)
    for words in (
        "Models sharing the node: shop/stray (ollama) on node n1",
        "indexer (background) 21.0 s",
        "2 requests whose caller left: the slot was held 60.0 s before they left",
        "0.03 s after (cancellation latency)",
        "2 rewritten prompts",
        "re-read 5.80 s of prefill",
        "agent / session s1: 2 rewrites, 5.80 s (1310 tokens)",
        "q alice (ok) 30.0 s: queued 21.0 s behind indexer (background) 21.0 s",
    ):
        assert words in text, words


def test_foreground_parts_add_up_to_wall_time() -> None:
    for report in (field_report(), field_report() + woken_requests()):
        doc = timeline(report, Sharing(None))
        wall = doc["foreground_wall"]
        total = sum(wall[k] for k in ("wake", "queue", "reread", "prefill", "decode", "other"))
        assert total == pytest.approx(wall["wall"])
        for entry in report:
            p = parts(entry)
            assert (
                p["wake"] + p["queue"] + p["reread"] + p["prefill"] + p["decode"] + p["other"]
            ) == pytest.approx(p["wall"])
            assert p["wall"] == pytest.approx(
                (entry.get("wake_wait_s") or 0.0) + (entry.get("duration_s") or 0.0))


def woken_requests() -> list[dict[str, Any]]:
    """Three requests the router held while ai/qwen3 woke (41 s in all), one
    that was not held."""
    woken = replace(BASE, caller="bob", duration=2.0, slot_seconds=2.0, prefill_seconds=0.5,
                    decode_seconds=1.0)
    return [e.as_json() for e in (
        replace(woken, request_id="w1", arrival=2000.0, wake_wait_s=14.7),
        replace(woken, request_id="w2", arrival=2000.5, wake_wait_s=13.8),
        replace(woken, request_id="w3", arrival=2001.0, wake_wait_s=12.5,
                priority="background"),
        replace(woken, request_id="w4", arrival=2020.0),
    )]


def test_time_held_for_a_wake_is_the_second_cause_before_queueing() -> None:
    doc = timeline(field_report() + woken_requests(), Sharing([]))
    assert doc["waking"] == {"requests": 3, "seconds": 41.0, "median_s": 13.8,
                             "longest_s": 14.7, "expired_at_router": None}
    # The wait comes before the gateway's arrival: on top of the duration.
    assert doc["foreground_wall"]["wake"] == pytest.approx(28.5)
    [slowest] = [b for b in doc["slowest"] if b["request_id"] == "w1"]
    assert (slowest["wall_s"], slowest["wake_s"]) == (16.7, 14.7)

    text = render_table(doc, "ai/qwen3", "ai/qwen3")
    assert (
        "2. Waking: 3 requests waited 41.0 s for ai/qwen3 to wake (median 13.8 s, "
        "longest 14.7 s)" in text
    )
    assert text.index("1. Models sharing") < text.index("2. Waking") < text.index(
        "3. Queueing")
    assert "= waking 28.5 s + queueing 21.0 s" in text
    assert "w1 bob (ok) 16.7 s: waited 14.7 s for a wake; queued 0.00 s" in text


def test_held_requests_that_expired_are_a_footnote_to_the_waking_cause() -> None:
    text = render_table(timeline(woken_requests(), Sharing([]), expired=2), "t", "ai/qwen3")
    assert "2 held requests gave up (503 at the router) before ai/qwen3 woke" in text
    quiet = render_table(timeline([], Sharing([]), expired=1), "t", "ai/qwen3")
    assert "2. Waking: no request waited for a wake" in quiet
    assert "1 held request gave up" in quiet


def test_a_model_that_never_slept_says_no_wake_and_adds_no_waking_part() -> None:
    doc = timeline(field_report(), Sharing([]))
    assert doc["waking"]["requests"] == 0 and doc["foreground_wall"]["wake"] == 0
    text = render_table(doc, "shop/chat")
    assert "2. Waking: no request waited for a wake" in text
    assert "gave up" not in text
    assert "Foreground wall time 51.5 s = queueing 21.0 s" in text


@pytest.mark.parametrize("status, expired", [
    ({"idle": {"lastWake": {"expired": 3}}}, 3),
    ({"idle": {"lastWake": {"expired": -1}}}, None),
    ({"idle": {"lastWake": {"expired": True}}}, None),
    ({"idle": {"lastWake": {"expired": "3"}}}, None),
    ({"idle": {"lastWake": ["expired"]}}, None),
    ({"idle": None}, None),
    ("not an object", None),
    ({}, None),
])
def test_the_expired_count_is_read_from_any_status_shape(status: Any, expired: int | None) -> None:
    assert expired_at_router({"status": status}) == expired


def test_unknown_engine_facts_are_said_not_guessed() -> None:
    entry = replace(BASE, request_id="x", duration=2.0, slot_seconds=2.0, prefill_seconds=0.5,
                    decode_seconds=1.4, prompt_tokens=100, generated_tokens=10,
                    session="s", rewrite=True, reread_seconds=None).as_json()
    doc = timeline([entry], Sharing(None))
    assert doc["rereads"]["unknown"] == 1 and doc["prefill"]["cache_unknown"] == 1
    text = render_table(doc, "t")
    assert "(1 not known)" in text
    assert "cache reuse not reported for 1 request" in text
    assert "not read (one gateway by URL, no cluster)" in text


def test_empty_ledger_reads_plainly() -> None:
    text = render_table(timeline([], Sharing([])), "t")
    assert "no request waited for a slot" in text and "Abandoned work: none" in text


def test_cli_reads_a_gateway_url_and_says_why_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", "m", "--gateway-url", "http://127.0.0.1:9"]) == 2
    assert "127.0.0.1:9" in capsys.readouterr().err
    json.dumps(timeline(field_report(), Sharing(None)))  # -o json is plain JSON


def test_the_models_sharing_the_node_are_read_as_doctor_reads_them() -> None:
    """The doctor's cluster (tests/harness/doctor_scenario.py): `chat` shares
    its node with a hand-made Ollama pod; `nogw` has its node to itself."""
    from localmodel.facts.node import from_node_list
    from localmodel.timeline.report import model_pods
    from tests.harness.doctor_scenario import scenario_pods
    from tests.harness.nodes import load_fixture, node_manifest

    manifests = [node_manifest(shape) for shape in load_fixture().nodes]
    pods = scenario_pods(from_node_list(manifests), "shop", amx_node="amx-0")
    ours, sharing = model_pods(pods, "shop", "chat")
    chat = next(p for p in pods if p["metadata"]["labels"].get("localmodel.dev/name") == "chat")
    assert ours == [chat["metadata"]["name"]]
    assert sharing.models == [f"shop/stray (ollama) on node {chat['spec']['nodeName']}"]
    alone, nobody = model_pods(pods, "shop", "nogw")
    assert len(alone) == 1 and nobody.models == []
    assert model_pods(pods, "elsewhere", "chat") == ([], Sharing([]))
    text = render_table(timeline([], sharing), "shop/chat")
    assert "1. Models sharing the node: shop/stray (ollama) on node" in text


def test_pods_without_the_gateway_are_named_they_keep_no_ledger() -> None:
    from localmodel.facts.node import from_node_list
    from localmodel.timeline.report import gatewayless
    from tests.harness.doctor_scenario import scenario_pods
    from tests.harness.nodes import load_fixture, node_manifest

    manifests = [node_manifest(shape) for shape in load_fixture().nodes]
    pods = scenario_pods(from_node_list(manifests), "shop", amx_node="amx-0")
    assert gatewayless(pods, "shop", "chat") == []
    assert gatewayless(pods, "shop", "nogw") == ["nogw-0"]
    assert gatewayless(pods, "elsewhere", "nogw") == []


def test_cli_without_a_reachable_cluster_says_which_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}],
              "current-context": "a"}
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(config))
    assert main(["timeline", "m", "--kubeconfig", str(kc), "--context", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert main(["timeline", "m", "--kubeconfig", str(kc), "-n", "ns"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("localmodel timeline: reading the cluster at https://127.0.0.1:9: ")
    assert "Traceback" not in err


def test_the_pod_proxy_request_carries_the_query_to_the_gateway(tmp_path: Path) -> None:
    """The official client escapes a "?" in a proxied path; the request must
    reach the API server as .../proxy/ledger?since=..., which it hands to the
    pod (the real API server and gateway: tests/realnode/test_timeline_on_node.py)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml
    from kubernetes.client import CoreV1Api

    from localmodel.kube import api_client
    from localmodel.timeline.cli import _ledger

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = json.dumps({"entries": [{"request_id": "r1"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = {"apiVersion": "v1", "kind": "Config",
                  "clusters": [{"name": "c", "cluster": {
                      "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
                  "users": [{"name": "u", "user": {"token": "t"}}],
                  "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}],
                  "current-context": "a"}
        kc = tmp_path / "kubeconfig"
        kc.write_text(yaml.safe_dump(config))
        core = CoreV1Api(api_client(str(kc)))
        since = "since=2026-12-02T01%3A00%3A00%2B00%3A00"
        assert _ledger(core, "shop", "chat-0", since) == [{"request_id": "r1"}]
    finally:
        server.shutdown()
        server.server_close()
    # (the client escapes the ":" of pod:port, which the API server reads back)
    assert seen == [f"/api/v1/namespaces/shop/pods/chat-0%3A8090/proxy/ledger?{since}"]
