"""`kubectl localmodel timeline` and `doctor -n` on the real node: the ledger read
through the API server's pod proxy from a running model pod's gateway, as a
user runs it (the plugin installed from pyproject.toml, the real kubectl).

A background job holds the model's only slot (one llama-server slot, one
thread) while a foreground question waits behind it, both through
`kubectl port-forward svc/NAME`. The timeline then says that the question
waited behind the job, with the numbers of the gateway's own ledger (read
separately through a port-forward to the pod's admin port: through the
Service, /ledger, /metrics and /speed answer 404), and that the model has the node to
itself; `-o yaml` carries what `-o json` does. `doctor -n` reads only that
namespace's model, its gateway's metrics through the pod proxy.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.engines import llama_server
from localmodel.gateway_contract import ADMIN_PATHS, ADMIN_PORT
from tests.harness.plugin import install_plugin, run_kubectl, shown_seconds
from tests.harness.processes import wait_until
from tests.realnode.journey import MODEL_NAMESPACE, Deployed, Journey

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-chart"  # test_metrics_scrape.py's model too: the same retained weights


@pytest.fixture(scope="module")
def model(journey: Journey) -> Iterator[Deployed]:
    with journey.deployed(NAME, llama_server.NAME) as deployed:
        yield deployed


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _chat(url: str, caller: str, max_tokens: int, background: bool = False) -> None:
    headers = {"Content-Type": "application/json", "X-LocalModel-Caller": caller}
    if background:
        headers["X-Priority"] = "background"
    body = {"model": "gemma3:270m", "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count from 1 to 500."}]}
    request = urllib.request.Request(f"{url}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.status == 200


def test_timeline_reads_the_pods_ledger_through_the_pod_proxy(
    journey: Journey, model: Deployed, tmp_path: Path
) -> None:
    tools = journey.cluster.tools
    assert tools is not None
    path = install_plugin(tmp_path / "plugin")
    kc = str(journey.cluster.admin_kubeconfig)

    def plugin(*args: str) -> str:
        out = run_kubectl(tools["kubectl"], path, "localmodel", *args, "--kubeconfig", kc)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        return out.stdout

    with journey.port_forward(f"svc/{NAME}") as url:
        job = threading.Thread(target=_chat, args=(url, "indexer", 128, True))
        job.start()
        wait_until("the job to hold the only slot", lambda: _get(f"{url}/slots")["busy"] == 1,
                   timeout=60, interval=0.05)
        assert _get(f"{url}/slots")["total"] == 1
        _chat(url, "alice", 4)
        job.join(timeout=300)
        # The admin paths are not served through the Service (it exposes only
        # the inference port): the ledger is read on the pod's admin port.
        for admin_path in ADMIN_PATHS:
            with pytest.raises(urllib.error.HTTPError) as absent:
                _get(f"{url}{admin_path}")
            assert absent.value.code == 404, admin_path
    pod = journey.pod_of(NAME)["metadata"]["name"]
    with journey.port_forward(f"pod/{pod}", remote=ADMIN_PORT) as admin:
        entries = _get(f"{admin}/ledger")["entries"]

    [alice] = [e for e in entries if e["caller"] == "alice"]
    [behind] = alice["waited_behind"]
    assert behind["caller"] == "indexer" and behind["priority"] == "background"
    assert behind["seconds"] > 0.5, alice

    data = json.loads(plugin("timeline", NAME, "-n", MODEL_NAMESPACE, "-o", "json"))
    assert yaml.safe_load(plugin("timeline", NAME, "-n", MODEL_NAMESPACE, "-o", "yaml")) == data
    assert data["sharing"] == []  # read from the cluster: the model has the node to itself
    assert {"caller": "indexer", "priority": "background",
            "seconds": round(behind["seconds"], 3)} in data["queueing"]["behind"]
    [mine] = [s for s in data["slowest"] if s["caller"] == "alice"]
    assert mine["queue_s"] == round(alice["queue_wait_s"], 3)
    assert mine["decode_s"] == round(alice["decode_s"], 3)
    table = plugin("timeline", NAME, "-n", MODEL_NAMESPACE)
    print("\n" + table)
    assert table.startswith(f"Where the time went: {MODEL_NAMESPACE}/{NAME}, since 2h: ")
    assert "1. Models sharing the node: none" in table
    assert shown_seconds(table, "indexer (background)") == pytest.approx(behind["seconds"],
                                                                         abs=0.06)

    # doctor -n: this namespace's model, its gateway read through the pod proxy.
    report = json.loads(_doctor(tools["kubectl"], path, kc))
    assert report["facts"]["namespace"] == MODEL_NAMESPACE
    assert report["facts"]["model_pods"] == 1 and report["facts"]["gateways"] == 1
    queue = [f for f in report["findings"] if f["check"] == "queue"]
    assert queue and not any("could not be read" in f["message"] for f in queue), queue


def _doctor(kubectl: Path, path: str, kc: str) -> str:
    """doctor exits 1 or 2 when it finds something: its output is what counts."""
    out = run_kubectl(kubectl, path, "localmodel", "doctor", "-n", MODEL_NAMESPACE, "-o",
                      "json", "--kubeconfig", kc)
    assert out.returncode in (0, 1, 2) and "Traceback" not in out.stderr, out.stderr
    return out.stdout
