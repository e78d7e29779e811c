"""What the renderer writes for Pod Security: every model pod without a
ServiceAccount token, with the runtime's seccomp profile, every container
without capabilities or privilege escalation, the gateway restricted, the
weights volume read-only for the engine; and, checked here as the API
server's Pod Security admission checks the `restricted` level
(kubernetes.io/docs/concepts/security/pod-security-standards/, the controls
a model pod can break), llama-server's pods pass it whole and Ollama's fail
only on its non-root user, which the image needs (docs/operator.md, Pod
Security). The real node's API server enforces both:
tests/realnode/test_pod_security.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from localmodel import engines
from localmodel.contract import CONTAINER_GATEWAY, VOLUME_WEIGHTS
from localmodel.desired import desired_state
from localmodel.engines import llama_server, ollama
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

URL = "https://models.example.org/gemma-3-270m-q4_k_m.gguf"
SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

Manifest = dict[str, Any]


def pod_of(engine: str, gguf: bool = True, gateway: bool = True) -> Manifest:
    make = MakeLocalModel("m").model("gemma3:270m").engine(engine).cpu(1).context(2048)
    if gguf:
        make = make.gguf(URL, SHA)
    if not gateway:
        make = make.spec(gateway={"enabled": False})
    node = MakeNode("n").cpus(4).memory_gib(16).cpu_flags({"AVX2", "FMA"}).facts()
    state = desired_state([make.obj()], [node], now="t", options=RenderOptions())
    [pod] = [o for o in state.models[0].objects if o["kind"] == "Pod"]
    return pod


def every_container(pod: Manifest) -> list[Manifest]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def restricted_violations(pod: Manifest) -> dict[str, set[str]]:
    """Container name -> the `restricted` controls it breaks, as Pod Security
    admission reads them (a container's setting wins over the pod's)."""
    pod_ctx = pod["spec"].get("securityContext") or {}
    found: dict[str, set[str]] = {}
    for c in every_container(pod):
        ctx = c.get("securityContext") or {}
        broken = set()
        if ctx.get("allowPrivilegeEscalation") is not False:
            broken.add("allowPrivilegeEscalation != false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {
            "NET_BIND_SERVICE"
        }:
            broken.add("unrestricted capabilities")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            broken.add("runAsNonRoot != true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            broken.add("runAsUser=0")
        profile = ctx.get("seccompProfile", pod_ctx.get("seccompProfile")) or {}
        if profile.get("type") not in ("RuntimeDefault", "Localhost"):
            broken.add("seccompProfile")
        if ctx.get("privileged"):
            broken.add("privileged")
        if broken:
            found[c["name"]] = broken
    return found


@pytest.mark.parametrize("engine", engines.NAMES)
@pytest.mark.parametrize("gateway", [True, False])
def test_every_model_pod_has_no_token_seccomp_and_no_capabilities(
    engine: str, gateway: bool
) -> None:
    pod = pod_of(engine, gateway=gateway)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in every_container(pod):
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, c["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert "privileged" not in ctx and "add" not in ctx["capabilities"]
    assert (CONTAINER_GATEWAY in [c["name"] for c in spec["containers"]]) is gateway


@pytest.mark.parametrize("engine", engines.NAMES)
def test_the_gateway_is_restricted_whatever_the_engine(engine: str) -> None:
    pod = pod_of(engine)
    [gw] = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_GATEWAY]
    ctx = gw["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert isinstance(ctx["runAsUser"], int) and ctx["runAsUser"] > 0  # numeric, not root
    assert ctx["readOnlyRootFilesystem"] is True
    assert CONTAINER_GATEWAY not in restricted_violations(pod)


@pytest.mark.parametrize("engine", engines.NAMES)
def test_the_engine_mounts_the_weights_read_only_and_only_init_steps_write_them(
    engine: str,
) -> None:
    pod = pod_of(engine)
    engine_container = pod["spec"]["containers"][0]
    [weights] = [m for m in engine_container["volumeMounts"] if m["name"] == VOLUME_WEIGHTS]
    assert weights["readOnly"] is True
    writers = [init["name"] for init in pod["spec"]["initContainers"]
               for m in init["volumeMounts"]
               if m["name"] == VOLUME_WEIGHTS and not m.get("readOnly")]
    assert writers, "no init step writes the weights"  # an init step may also only read them


def test_llama_server_pods_pass_restricted_whole() -> None:
    for gateway in (True, False):
        pod = pod_of(llama_server.NAME, gateway=gateway)
        assert restricted_violations(pod) == {}
        ctx = pod["spec"]["securityContext"]
        # The non-root download step writes the volume through its group.
        assert ctx["fsGroup"] == ctx["runAsUser"] and ctx["runAsUser"] > 0
        assert ctx["fsGroupChangePolicy"] == "OnRootMismatch"
        for c in every_container(pod):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]


@pytest.mark.parametrize("gguf", [True, False])
def test_ollama_pods_break_restricted_only_by_running_as_root(gguf: bool) -> None:
    pod = pod_of(ollama.NAME, gguf=gguf)
    root = {"runAsNonRoot != true"}
    expected = {ollama.NAME: root, "pull": root}
    if gguf:  # the download step says root explicitly: the volume is root's
        expected["download"] = root | {"runAsUser=0"}
    assert restricted_violations(pod) == expected


def test_the_checker_sees_what_the_renderer_left_out() -> None:
    """The table above is not vacuous: a pod stripped of the settings breaks
    every control it reads."""
    pod = pod_of(llama_server.NAME)
    pod["spec"]["securityContext"] = {}
    for c in every_container(pod):
        c["securityContext"] = {"runAsUser": 0}
    broken = restricted_violations(pod)
    assert set(broken) == {c["name"] for c in every_container(pod)}
    assert all(v == {"allowPrivilegeEscalation != false", "unrestricted capabilities",
                     "runAsNonRoot != true", "runAsUser=0", "seccompProfile"}
               for v in broken.values())
