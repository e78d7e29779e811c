"""tinyserve served as the operator renders it, by the REAL gateway and the
REAL router, each its own program (`localmodel gateway --engine tinyserve`,
`localmodel router --replicas`), in front of the stand-in started with the
config file its pod's init step writes: the official `openai` client through
the router gets tinyserve's answer, and the gateway's ledger and speed hold
the account tinyserve gave in its own dialect (`tiny_ledger`, microseconds),
read by its timing reader (tests/engines/tinyserve/timing.py)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from openai.types.chat import ChatCompletionMessageParam

from localmodel.contract import CONTAINER_GATEWAY
from localmodel.gateway_contract import ENV_PREFIX, env_name
from localmodel.gateway_contract.marks import pem_of
from tests.builders import MakeLocalModel
from tests.conformance.subjects import render
from tests.engines.tinyserve import HEALTH_PATH, NAME
from tests.engines.tinyserve.pod import CONTAINER_CONFIGURE
from tests.engines.tinyserve.server import READ_US, SPEECH, WROTE_US
from tests.harness.processes import (
    ManagedProcess,
    free_ports,
    http_ok,
    localmodel_process,
)
from tests.harness.tools import REPO_ROOT

MODEL = "gemma3:270m"
MADE = (MakeLocalModel("tiny").model(MODEL).engine(NAME).gguf().cpu(2).context(4096)
        .spec(slots=2))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _rendered_config() -> tuple[dict[str, Any], dict[str, str]]:
    """What the rendered pod tells tinyserve (its init step's config file) and
    its gateway (the gateway container's variables)."""
    pod = render(MADE).pod["spec"]
    [configure] = [c for c in pod["initContainers"] if c["name"] == CONTAINER_CONFIGURE]
    _, _, document, _, _ = shlex.split(configure["command"][2])
    [gateway] = [c for c in pod["containers"] if c["name"] == CONTAINER_GATEWAY]
    env = {e["name"]: e["value"] for e in gateway["env"] if e["name"].startswith(ENV_PREFIX)}
    return json.loads(document), env


@dataclass
class Served:
    router: str
    gateway_admin: str


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    engine_port, gw_port, gw_admin, router_port, router_admin = free_ports(5)
    config, gateway_env = _rendered_config()
    assert config["listen"] == "127.0.0.1:8300" and config["ledger"] == "on"
    config["listen"] = f"127.0.0.1:{engine_port}"  # the pod's port may be taken here
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = ManagedProcess(
        NAME, [sys.executable, "-m", "tests.engines.tinyserve.server",
               str(tmp_path / "config.json")], tmp_path / "tinyserve.log",
        env=dict(os.environ), cwd=REPO_ROOT)
    gateway_env |= {
        env_name("upstream"): f"http://127.0.0.1:{engine_port}",
        env_name("listen"): f"127.0.0.1:{gw_port}",
        env_name("admin-listen"): f"127.0.0.1:{gw_admin}",
    }
    gateway = localmodel_process("gateway", ["gateway", "--engine", NAME],
                                 tmp_path / "gateway.log", env=os.environ | gateway_env)
    key = tmp_path / "signing.pem"
    key.write_bytes(pem_of(Ed25519PrivateKey.generate()))
    gw_url, admin_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{gw_admin}"
    router = localmodel_process("router", [
        "router", "--replicas", f"{MODEL}={gw_url}|{admin_url}",
        "--listen", f"127.0.0.1:{router_port}", "--admin-listen", f"127.0.0.1:{router_admin}",
        "--signing-key", str(key)], tmp_path / "router.log")
    router_url = f"http://127.0.0.1:{router_port}"
    with (engine.serving("tinyserve", lambda: http_ok(
              f"http://127.0.0.1:{engine_port}{HEALTH_PATH}"), 60),
          gateway.serving("the gateway ready (calibrated)",
                          lambda: http_ok(gw_url + "/readyz"), 60),
          router.serving("the router", lambda: http_ok(router_url + "/healthz"), 60)):
        yield Served(router_url, admin_url)


def test_tinyserve_answers_through_the_router_and_its_account_fills_the_ledger(
        served: Served) -> None:
    with openai.OpenAI(base_url=served.router + "/v1", api_key="unused", max_retries=0) as client:
        asked: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "say something tiny"}]
        done = client.chat.completions.create(model=MODEL, messages=asked, max_tokens=5)
        said = "".join(w + " " for w in SPEECH[:5])
        assert done.choices[0].message.content == said
        assert done.choices[0].finish_reason == "length"
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 5)
        longer: list[ChatCompletionMessageParam] = [
            *asked, {"role": "assistant", "content": said.strip()},
            {"role": "user", "content": "more"}]
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=longer, max_tokens=4, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(w + " " for w in SPEECH[:4])

    entries = _get(served.gateway_admin + "/ledger")["entries"]
    assert [(e["prompt_tokens"], e["cached_tokens"], e["generated_tokens"]) for e in entries] == [
        (3, 0, 5),  # its first prompt: nothing in its prompt memo
        (9, 3, 4),  # the conversation's opening words reused
    ]
    # Its times, in microseconds per token (server.py), as the ledger's seconds.
    assert [(e["prefill_s"], e["decode_s"]) for e in entries] == [
        (round(3 * READ_US / 1e6, 4), 5 * WROTE_US / 1e6),
        (round(6 * READ_US / 1e6, 4), 4 * WROTE_US / 1e6),
    ]
    assert [e["evaluated_tokens"] for e in entries] == [3, 6]
    assert [e["routed"] for e in entries] == ["owner", "owner"]  # through the router

    # The calibration at readiness read tinyserve's account too: exactly the
    # tokens asked (its `exact_length`), at its own rate.
    calibration = _get(served.gateway_admin + "/speed")["calibration"]
    assert calibration["complete"] and calibration["error"] is None
    assert calibration["generated_tokens"] == 32
    assert calibration["decode_tokens_per_second"] == pytest.approx(1e6 / WROTE_US)
