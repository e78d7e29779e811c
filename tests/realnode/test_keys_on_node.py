"""API keys in a model pod on the real node, for either engine: a keys Secret
and a LocalModel naming it (`spec.gateway.auth.keysSecretRef`), as a cluster
admin would. The pod becomes Ready with no container restarted (the gateway,
uid 65532, reads the file the kubelet wrote: before the file's mode was
0444 it exited 2 with `Permission denied` in Ollama's pods and crash-looped),
answers a request with the key and refuses one without it (401); only the
gateway container has the file (render/gateway.py, KEYS_MODE).
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from localmodel.contract import CONTAINER_GATEWAY
from localmodel.engines import llama_server, ollama
from localmodel.gateway_contract import GATEWAY_PORT
from localmodel.podspec import NONROOT_UID
from localmodel.render.gateway import KEYS_DIR
from tests.realnode.journey import (
    LLAMA_SERVER_CALLS,
    MODEL_NAMESPACE,
    OLLAMA_CALLS,
    EngineCalls,
    Journey,
    engine_container,
    http_json,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

KEY = f"lm-realnode-{secrets.token_hex(12)}"


def post(url: str, body: dict[str, Any], key: str | None) -> tuple[int, Any]:
    return http_json(url, body, timeout=180, key=key)


@pytest.mark.parametrize(("engine", "calls"), [
    pytest.param(llama_server.NAME, LLAMA_SERVER_CALLS, marks=pytest.mark.llama,
                 id="llama-server"),
    pytest.param(ollama.NAME, OLLAMA_CALLS, id="ollama"),
])
def test_a_model_with_keys_starts_answers_with_the_key_and_refuses_without(
    journey: Journey, engine: str, calls: EngineCalls,
) -> None:
    name = f"gemma-keys-{engine}"
    secret = f"{name}-keys"
    api = journey.cluster.api()
    secret_path = journey.keys_secret(MODEL_NAMESPACE, secret, KEY, "realnode")
    manifest = journey.local_model(name, engine)
    manifest["spec"]["gateway"] = {"auth": {"keysSecretRef": {"name": secret,
                                                              "key": "keys.json"}}}
    try:
        journey.deploy(manifest)
        pod = journey.pod_of(name)
        restarts = {s["name"]: s["restartCount"] for s in pod["status"]["containerStatuses"]}
        assert restarts[CONTAINER_GATEWAY] == 0, (restarts, journey.describe_model(name))
        url = f"http://{pod['status']['podIP']}:{GATEWAY_PORT}{calls.short_path}"
        status, answer = post(url, calls.short_body, KEY)
        assert status == 200, answer
        status, refused = post(url, calls.short_body, None)
        assert status == 401, refused
        status, refused = post(url, calls.short_body, KEY + "x")
        assert status == 401, refused
        # The gateway (not root) reads the file; the engine has no such path.
        pod_name = pod["metadata"]["name"]
        seen = journey.exec(pod_name, CONTAINER_GATEWAY,
                            f"id -u; head -c 9 {KEYS_DIR}/keys.json; echo; ls -ln {KEYS_DIR}/")
        assert seen.splitlines()[0] == str(NONROOT_UID), seen
        assert '{"keys":' in seen, seen
        print(f"{engine}: the gateway's view of the keys:\n{seen}")
        engine_view = journey.exec(pod_name, engine_container(engine),
                                   f"ls {KEYS_DIR} 2>&1 || true")
        assert "No such file or directory" in engine_view, engine_view
    finally:
        journey.delete_model(name)
        api.request("DELETE", secret_path)
