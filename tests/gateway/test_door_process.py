"""The door as the operator meets it: the REAL gateway program (`localmodel
gateway --engine tinyserve`, its own process, its lease from
LOCALMODEL_GATEWAY_YIELD_LEASE) in front of tinyserve (tests/engines/tinyserve,
a test-only STAND-IN engine, its own process). The operator's `sign_yield`
mark closes it; the official `openai` client then gets 503 with
X-LocalModel-Asleep and Retry-After in OpenAI's error shape; the operator's
own reader of /speed (gateway_contract/speed_answer.py) reads the activity;
nobody renews, so the lease reopens it and the client is served again."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract import SPEED_PATH, YIELD_PATH, env_name
from localmodel.gateway_contract.headers import ASLEEP
from localmodel.gateway_contract.marks import MARK_HEADER, public_key_text, sign_yield
from localmodel.gateway_contract.speed_answer import reading_from_answer
from tests.engines.tinyserve import HEALTH_PATH, NAME
from tests.harness.processes import (
    ManagedProcess,
    free_ports,
    http_ok,
    localmodel_process,
    wait_until,
)
from tests.harness.tools import REPO_ROOT

MODEL = "gemma3:270m"
OPERATOR = Ed25519PrivateKey.generate()
HERE = ("team-a", "tiny-0")
LEASE_S = 15  # the option under test (the default is 60); long enough for the 503 check


@dataclass
class Served:
    url: str
    admin: str


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    engine_port, gw_port, gw_admin = free_ports(3)
    (tmp_path / "config.json").write_text(json.dumps(
        {"listen": f"127.0.0.1:{engine_port}", "serve_as": MODEL, "ledger": "on"}))
    engine = ManagedProcess(
        NAME, [sys.executable, "-m", "tests.engines.tinyserve.server",
               str(tmp_path / "config.json")], tmp_path / "tinyserve.log",
        env=dict(os.environ), cwd=REPO_ROOT)
    env = os.environ | {
        env_name("engine"): NAME,
        env_name("model"): MODEL,
        env_name("upstream"): f"http://127.0.0.1:{engine_port}",
        env_name("listen"): f"127.0.0.1:{gw_port}",
        env_name("admin-listen"): f"127.0.0.1:{gw_admin}",
        env_name("calibrate-tokens"): "0",
        env_name("router-key"): public_key_text(OPERATOR),
        env_name("pod-namespace"): HERE[0],
        env_name("pod-name"): HERE[1],
        env_name("yield-lease"): str(LEASE_S),
    }
    gateway = localmodel_process("gateway", ["gateway"], tmp_path / "gateway.log", env=env)
    url, admin = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{gw_admin}"
    with (engine.serving("tinyserve", lambda: http_ok(
              f"http://127.0.0.1:{engine_port}{HEALTH_PATH}"), 60),
          gateway.serving("the gateway ready", lambda: http_ok(url + "/readyz"), 60)):
        yield Served(url, admin)


def _yield(admin: str, reason: str, idle_at_least: int) -> tuple[int, dict[str, Any]]:
    mark = sign_yield(OPERATOR, *HERE, reason, idle_at_least, time.time())
    request = urllib.request.Request(
        admin + YIELD_PATH, method="POST",
        data=json.dumps({"reason": reason, "idle_at_least": idle_at_least}).encode(),
        headers={MARK_HEADER: mark, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _activity(admin: str) -> Any:
    with urllib.request.urlopen(admin + SPEED_PATH, timeout=10) as resp:
        return reading_from_answer(resp.read(), 0.0, "u0").activity


def test_the_operators_mark_closes_the_gateway_program_until_its_lease_lapses(
        served: Served) -> None:
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as client:
        def ask() -> str | None:
            done = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            return done.choices[0].message.content

        assert ask()
        assert _activity(served.admin).arrived == 1
        status, body = _yield(served.admin, "sleep", 0)
        assert (status, body) == (200, {"closed": True, "lease_seconds": float(LEASE_S)})
        with pytest.raises(openai.APIStatusError) as asleep:
            ask()
        assert asleep.value.status_code == 503
        assert asleep.value.response.headers[ASLEEP] == "1"
        assert int(asleep.value.response.headers["Retry-After"]) >= 1
        assert "asleep" in asleep.value.message
        activity = _activity(served.admin)
        assert activity is not None and activity.closed and activity.in_flight == 0
        assert activity.arrived == 2
        # Nobody renews: it opens by itself.
        wait_until("the lease to lapse", lambda: _activity(served.admin).closed is False,
                   timeout=60, interval=0.2)
        assert ask()
