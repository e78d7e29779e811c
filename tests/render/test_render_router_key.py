"""The router's public key reaches every gateway only with the router on
(render/gateway.py): its `--router-key` and the pod's own namespace and name
from the downward API, which the router's marks must name; without the
router, the gateway's env is as before (the golden renders hold that for
every example: test_render_golden.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel import engines
from localmodel.desired import desired_state
from localmodel.gateway.config import parse_config
from localmodel.gateway_contract import env_name
from localmodel.gateway_contract.marks import public_key_text
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

KEY = public_key_text(Ed25519PrivateKey.generate())
NODE = MakeNode("n1").cpu_flags(frozenset({"AVX2"}))
IDENTITY = {env_name("pod-namespace"): "metadata.namespace", env_name("pod-name"): "metadata.name"}


SHA = "0" * 64
# Every engine's (a GGUF file: the one source every engine serves).
MODELS = {name: MakeLocalModel("chat").spec(model="gemma3:270m", cpu=2)
          .engine(name).gguf("https://example.com/g.gguf", SHA) for name in engines.NAMES}


def _gateway(engine: str, options: RenderOptions) -> dict[str, Any]:
    model = MODELS[engine].obj()
    state = desired_state([model], [NODE.facts()], now="2026-12-06T00:00:00Z", options=options)
    pod = by_kind_name(state.models[0].objects)["Pod/chat-0"]
    return next(c for c in pod["spec"]["containers"] if c["name"] == "gateway")


@pytest.mark.parametrize("engine", engines.NAMES)
def test_the_router_key_and_the_pods_identity_reach_the_gateway_with_the_router_on(
        engine: str) -> None:
    gateway = _gateway(engine, RenderOptions(router_namespace="localmodel-system",
                                             router_key=KEY))
    plain = {e["name"]: e["value"] for e in gateway["env"] if "value" in e}
    assert plain[env_name("router-key")] == KEY
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in gateway["env"]
              if "fieldRef" in e.get("valueFrom", {})}
    assert fields == IDENTITY
    # What the gateway makes of them (the kubelet fills the downward API's values).
    config = parse_config([], {**plain, env_name("pod-namespace"): "team-a",
                               env_name("pod-name"): "chat-0"})
    assert base64.b64decode(config.router_key) and config.router_key == KEY
    assert (config.pod_namespace, config.pod_name) == ("team-a", "chat-0")


@pytest.mark.parametrize("options", [RenderOptions(),
                                     RenderOptions(router_namespace="localmodel-system")])
def test_without_the_routers_key_the_gateway_is_told_nothing_of_it(
        options: RenderOptions) -> None:
    names = {e["name"] for e in _gateway("ollama", options)["env"]}
    assert not names & {env_name("router-key"), *IDENTITY}
