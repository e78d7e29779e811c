"""`localmodel doctor` as a process against the real API server, with a real gateway.

What is real: kube-apiserver, the scheduler-free pods as the operator renders
them (and two hand-made Ollama pods) created through the API, the doctor CLI
with the admin kubeconfig, and the queue: a REAL `localmodel gateway` process in
front of a REAL llama-server (Gemma 3 270M, one thread), with one caller holding
the only slot, two people waiting and two background jobs turned away.

What stands in: kwok runs no containers, so the `chat` pod's gateway cannot be
reached through the API server's pod proxy; doctor reads it from the local
gateway with `--metrics-url NAMESPACE/chat-0=URL` (the override a person uses
after `kubectl port-forward`). llama-server with Gemma stands in for the pod's
Ollama engine behind that gateway.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localmodel.facts.node import from_node_list
from tests.harness import TestCluster
from tests.harness.doctor_scenario import chat_pod_key, scenario_pods
from tests.harness.engines import LlamaServer, llama_server
from tests.harness.processes import free_port, http_ok, localmodel_process, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
AMX_NODE = "amx-0"


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    env.pop("KUBECONFIG", None)
    return env


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@dataclass
class Caller:
    """One chat request on its own connection, in a thread; `hang_up` closes it."""

    port: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.conn.request("POST", "/v1/chat/completions", json.dumps(self.body),
                              {"Content-Type": "application/json", **self.headers})
            response = self.conn.getresponse()
            self.status = response.status
            response.read()
        except OSError as e:
            self.error = str(e)

    def hang_up(self) -> None:
        if self.conn.sock is not None:
            with contextlib.suppress(OSError):
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=30)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[LlamaServer]:
    one_thread = ["-c", "2048", "-np", "1", "-t", "1", "--metrics", "--no-warmup"]
    with llama_server(tmp_path, one_thread) as server:
        yield server


@pytest.fixture
def gateway_ports(engine: LlamaServer, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """The gateway's port and its admin port (/metrics)."""
    port, admin = free_port(), free_port()
    process = localmodel_process(
        "gateway",
        ["gateway", "--upstream", engine.url, "--engine", "llama-server",
         "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--slots", "1", "--max-queue", "4", "--model", "gemma"],
        tmp_path / "gateway.log",
        env=_env(),
    )

    ready = f"http://127.0.0.1:{port}/readyz"
    with process.serving("the gateway /readyz", lambda: http_ok(ready), 60):
        yield port, admin


@pytest.fixture
def gateway(gateway_ports: tuple[int, int]) -> int:
    return gateway_ports[0]


@pytest.fixture
def gateway_admin(gateway_ports: tuple[int, int]) -> int:
    return gateway_ports[1]


def chat(max_tokens: int, *, ignore_eos: bool = False) -> dict[str, Any]:
    return {
        "model": "gemma",
        "messages": [{"role": "user", "content": "Count from 1 to 2000, one number per line."}],
        "max_tokens": max_tokens,
        "stream": False,
        **({"ignore_eos": True} if ignore_eos else {}),
    }


@pytest.mark.engine  # a real llama-server behind the gateway
@pytest.mark.llama
def test_doctor_finds_two_models_no_gateway_a_queue_and_an_amx_node(
    cluster: TestCluster, namespace: str, gateway: int, gateway_admin: int
) -> None:
    api = cluster.api()
    nodes = from_node_list(api.get("/api/v1/nodes"))
    pods = scenario_pods(nodes, namespace, amx_node=AMX_NODE)
    for pod in pods:
        api.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    # Speed first needs one finished generation; then one caller holds the only
    # slot, two people wait behind it and two background jobs are turned away.
    warm = Caller(gateway, chat(16))
    warm.thread.join(timeout=120)
    assert warm.status == 200, warm.error
    holder = Caller(gateway, chat(1500, ignore_eos=True))
    slots = f"http://127.0.0.1:{gateway}/slots"
    wait_until("the slot to be taken", lambda: _get_json(slots)["busy"] == 1, timeout=30)
    waiting = [Caller(gateway, chat(8)) for _ in range(2)]
    background = [Caller(gateway, chat(8), {"X-Priority": "background"}) for _ in range(2)]
    for job in background:
        job.thread.join(timeout=30)
    assert [job.status for job in background] == [429, 429]
    wait_until("two people waiting", lambda: _get_json(slots)["queued"]["foreground"] == 2,
               timeout=30)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "localmodel.cli", "doctor", "-o", "json",
             "--kubeconfig", str(cluster.admin_kubeconfig),
             "--metrics-url", f"{chat_pod_key(pods)}=http://127.0.0.1:{gateway_admin}/metrics"],
            capture_output=True, text=True, timeout=120, env=_env(),
        )
        table = subprocess.run(
            [sys.executable, "-m", "localmodel.cli", "doctor",
             "--kubeconfig", str(cluster.admin_kubeconfig),
             "--metrics-url", f"{chat_pod_key(pods)}=http://127.0.0.1:{gateway_admin}/metrics"],
            capture_output=True, text=True, timeout=120, env=_env(),
        )
    finally:
        holder.hang_up()
        for caller in waiting:
            caller.hang_up()
    print("\n" + table.stdout)
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    findings = [f for f in report["findings"] if namespace in f["message"]]

    def one(check: str, *words: str) -> Any:
        matches = [f for f in findings if f["check"] == check and all(w in f["message"]
                                                                      for w in words)]
        assert len(matches) == 1, (check, words, report["findings"])
        return matches[0]

    chat_pod = next(p for p in pods if p["metadata"]["name"].startswith("chat-"))
    node = chat_pod["spec"]["nodeName"]
    # (other tests' pods may share the node, so the count is not asserted exactly)
    two = one("models-per-node", f"node {node} holds", f"{namespace}/stray",
              f"{namespace}/{chat_pod['metadata']['name']}")
    assert two["verdict"] in ("warn", "fail") and f"move or stop {namespace}/stray" in two["fix"]

    nogw = one("cancellation", f"{namespace}/nogw-0", "without the gateway")
    assert nogw["verdict"] == "warn"
    assert f"spec.gateway.enabled: true on LocalModel {namespace}/nogw" in nogw["fix"]

    queue = one("queue", chat_pod_key(pods))
    assert queue["verdict"] == "warn"
    assert "1/1 slots busy, 2 foreground waiting, 2 background turned away" in queue["message"]
    assert "spec.replicas" in queue["fix"]

    amx = one("amx", f"AMX node {AMX_NODE}", f"{namespace}/amx-legacy")
    assert amx["verdict"] == "fail"
    assert "0.32.2" in amx["fix"] and "libggml-cpu-sapphirerapids.so" in amx["fix"]
    assert "cpu_avx2" not in amx["fix"]  # 0.31.0: OLLAMA_LLM_LIBRARY picks no CPU variant

    speed = one("speed", chat_pod_key(pods))
    assert "decode" in speed["message"] and "tok/s" in speed["message"]
    assert result.returncode == 2  # failures present
