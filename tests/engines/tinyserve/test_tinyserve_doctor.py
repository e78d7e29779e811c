"""doctor's reading of a running tinyserve (its adapter's doctor part over
its state path), against the stand-in started from a config file: what it
serves, its workers, lanes and window; and doctor's pod reading finds it by
its image among the shipped engines."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

from localmodel.engine_pods import engine_pods
from localmodel.engines.registry import SHIPPED_NAMES, engine
from tests.conformance.subjects import base_model, render
from tests.engines.tinyserve import HEALTH_PATH, NAME, VERSION
from tests.harness.processes import ManagedProcess, free_port, http_ok
from tests.harness.tools import REPO_ROOT


def test_doctor_reads_what_a_running_tinyserve_serves_and_how(tmp_path: Path) -> None:
    port = free_port()
    config = {"listen": f"127.0.0.1:{port}", "serve_as": "gemma3:270m", "workers": 3,
              "lanes": 2, "window": 4096}
    (tmp_path / "config.json").write_text(json.dumps(config))
    base = f"http://127.0.0.1:{port}"

    def get(path: str, body: Any) -> Any:
        with urllib.request.urlopen(base + path, timeout=5) as resp:
            return json.loads(resp.read())

    server = ManagedProcess(NAME, [sys.executable, "-m", "tests.engines.tinyserve.server",
                                   str(tmp_path / "config.json")], tmp_path / "tinyserve.log",
                            env=dict(os.environ), cwd=REPO_ROOT)
    with server.serving("tinyserve", lambda: http_ok(base + HEALTH_PATH), 60):
        reading = engine(NAME).doctor.read(get, None)
    assert reading.version == VERSION and not reading.loading
    assert [(m.name, m.context) for m in reading.models] == [("gemma3:270m", 4096)]
    assert (reading.threads, reading.slots, reading.context_per_slot) == (3, 2, 4096)


def test_doctor_tells_a_tinyserve_pod_from_the_shipped_engines_pods() -> None:
    pods = []
    for i, name in enumerate((*SHIPPED_NAMES, NAME)):
        pod = render(base_model(name)).pod
        pod["metadata"]["name"] = f"pod-{i}"
        pod["spec"]["nodeName"] = "node-a"
        pods.append(pod)
    assert [p.engine for p in engine_pods(pods)] == [*SHIPPED_NAMES, NAME]
