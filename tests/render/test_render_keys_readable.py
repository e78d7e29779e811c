"""A model pod with API keys starts: its gateway can read the keys file, for
both engines, as the kubelet lays the Secret volume out (owner root; group the
pod's `fsGroup`, else root's; the volume's `defaultMode`) and as the container
runs (its `runAsUser`/`runAsGroup`, else the pod's; supplementary groups the
pod's `fsGroup` and `supplementalGroups`). Only the gateway mounts the file.

Before this (render/gateway.py, 0440 and no `fsGroup` on Ollama's pods) the
Ollama gateway (uid 65532) exited 2 with `Permission denied:
'/etc/localmodel/keys/keys.json'` on the real node."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel import engines
from localmodel.contract import CONTAINER_GATEWAY, VOLUME_KEYS
from localmodel.desired import desired_state
from localmodel.podspec import NONROOT_UID
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

URL = "https://models.example.org/gemma-3-270m-q4_k_m.gguf"
SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
KEYS = {"keysSecretRef": {"name": "team-keys", "key": "keys.json"}}
IMAGE_USER = 0  # an image's own user when the pod says none: root (Ollama's image)

Manifest = dict[str, Any]


def pod_with_keys(engine: str) -> Manifest:
    make = (MakeLocalModel("m").model("gemma3:270m").engine(engine).cpu(1).context(2048)
            .gguf(URL, SHA).spec(gateway={"auth": KEYS}))
    node = MakeNode("n").cpus(4).memory_gib(16).cpu_flags({"AVX2", "FMA"}).facts()
    state = desired_state([make.obj()], [node], now="t", options=RenderOptions())
    [pod] = [o for o in state.models[0].objects if o["kind"] == "Pod"]
    return pod


def secret_file(pod: Manifest) -> tuple[int, int, int]:
    """(owner uid, group, mode) of the keys file as the kubelet writes it: root's,
    re-grouped to `fsGroup` (and made group-readable) when the pod has one."""
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == VOLUME_KEYS]
    mode = volume["secret"].get("defaultMode", 0o644)
    fs_group = pod["spec"].get("securityContext", {}).get("fsGroup")
    if fs_group is None:
        return 0, 0, mode
    return 0, fs_group, mode | 0o440


def identity(pod: Manifest, container: Manifest) -> tuple[int, set[int]]:
    """(uid, groups) a container's process runs with."""
    pod_ctx = pod["spec"].get("securityContext", {})
    ctx = {**pod_ctx, **container.get("securityContext", {})}
    uid = ctx.get("runAsUser", IMAGE_USER)
    groups = {ctx.get("runAsGroup", 0), *pod_ctx.get("supplementalGroups", [])}
    if "fsGroup" in pod_ctx:
        groups.add(pod_ctx["fsGroup"])
    return uid, groups


def can_read(file: tuple[int, int, int], uid: int, groups: set[int]) -> bool:
    """POSIX permission check, without CAP_DAC_OVERRIDE (every container drops
    every capability)."""
    owner, group, mode = file
    if uid == owner:
        return bool(mode & 0o400)
    if group in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def containers(pod: Manifest) -> list[Manifest]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


@pytest.mark.parametrize("engine", engines.NAMES)
def test_the_gateway_can_read_the_keys_file_in_either_engines_pod(engine: str) -> None:
    pod = pod_with_keys(engine)
    [gateway] = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_GATEWAY]
    uid, groups = identity(pod, gateway)
    assert uid == NONROOT_UID  # (not root: it reads the file by its mode or group)
    assert can_read(secret_file(pod), uid, groups)


@pytest.mark.parametrize("engine", engines.NAMES)
def test_only_the_gateway_mounts_the_keys_file(engine: str) -> None:
    pod = pod_with_keys(engine)
    mounting = [c["name"] for c in containers(pod)
                if any(m["name"] == VOLUME_KEYS for m in c.get("volumeMounts", []))]
    assert mounting == [CONTAINER_GATEWAY]
    [mount] = [m for c in containers(pod) for m in c.get("volumeMounts", [])
               if m["name"] == VOLUME_KEYS]
    assert mount["readOnly"] is True


def test_keys_leave_ollamas_pod_security_and_weights_volume_as_they_were() -> None:
    # No fsGroup on Ollama's pods: the kubelet leaves its root-owned weights
    # volume's ownership (and its files' change time) alone.
    with_keys = pod_with_keys("ollama")
    assert "fsGroup" not in with_keys["spec"]["securityContext"]
    plain = MakeLocalModel("m").model("gemma3:270m").engine("ollama").cpu(1).context(2048)
    node = MakeNode("n").cpus(4).memory_gib(16).cpu_flags({"AVX2", "FMA"}).facts()
    state = desired_state([plain.gguf(URL, SHA).obj()], [node], now="t",
                          options=RenderOptions())
    [pod] = [o for o in state.models[0].objects if o["kind"] == "Pod"]
    assert with_keys["spec"]["securityContext"] == pod["spec"]["securityContext"]


@pytest.mark.parametrize(("file", "uid", "groups", "ok"), [
    ((0, 0, 0o440), NONROOT_UID, {NONROOT_UID}, False),  # the Ollama pod before: refused
    ((0, NONROOT_UID, 0o440), NONROOT_UID, {NONROOT_UID}, True),  # fsGroup
    ((0, 0, 0o444), NONROOT_UID, {NONROOT_UID}, True),
    ((0, 0, 0o400), 0, {0}, True),
    ((0, 0, 0o040), 0, {0}, False),  # the owner's bits are the owner's, not the group's
])
def test_the_permission_arithmetic(file: tuple[int, int, int], uid: int, groups: set[int],
                                   ok: bool) -> None:
    assert can_read(file, uid, groups) is ok
