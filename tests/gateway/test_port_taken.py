"""A program whose port is taken says so in one line naming its flag and the
address, and exits 2 (localmodel.settings.PortTaken): the router's --listen
and --admin-listen, the gateway's, and the operator's --metrics-listen and
--health-listen (`localmodel run`). The probe listens on nothing.

Each program runs as a subprocess (`localmodel_process`: `python -m
localmodel.cli`); the test holds the port with a listening socket of its own.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.marks import pem_of
from tests.harness.processes import free_port, localmodel_process

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: unused}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def held() -> Iterator[int]:
    """A port on 127.0.0.1 that this test listens on."""
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield port


def _run(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """The program's exit code and what it wrote on stderr."""
    proc = localmodel_process(args[0], args, tmp_path / "out.log",
                              err_path=tmp_path / "err.log")
    proc.start()
    try:
        code = proc.wait(120)
    finally:
        proc.stop()
    return code, (tmp_path / "err.log").read_text(errors="replace")


CASES = {
    "router --listen": (["router", "--replicas", "m=http://127.0.0.1:9", "--listen", "{held}",
                         "--admin-listen", "127.0.0.1:0", "--signing-key", "{signing_key}"],
                        "--listen"),
    "router --admin-listen": (["router", "--replicas", "m=http://127.0.0.1:9", "--listen",
                               "127.0.0.1:0", "--admin-listen", "{held}",
                               "--signing-key", "{signing_key}"], "--admin-listen"),
    "gateway --listen": (["gateway", "--listen", "{held}", "--admin-listen", "127.0.0.1:0"],
                         "--listen"),
    "gateway --admin-listen": (["gateway", "--listen", "127.0.0.1:0", "--admin-listen",
                                "{held}"], "--admin-listen"),
    "operator --health-listen": (["run", "--kubeconfig", "{kubeconfig}", "--health-listen",
                                  "{held}", "--metrics-listen", "off"], "--health-listen"),
    "operator --metrics-listen": (["run", "--kubeconfig", "{kubeconfig}", "--health-listen",
                                   "127.0.0.1:{free}", "--metrics-listen", "{held}"],
                                  "--metrics-listen"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_taken_port_is_one_line_naming_its_flag_and_exit_2(
        case: str, held: int, tmp_path: Path) -> None:
    args, flag = CASES[case]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    signing_key = tmp_path / "signing.pem"  # as the chart mounts it (no notice of a made key)
    signing_key.write_bytes(pem_of(Ed25519PrivateKey.generate()))
    where = f"127.0.0.1:{held}"
    code, stderr = _run([a.format(held=where, kubeconfig=kubeconfig, free=free_port(),
                                  signing_key=signing_key) for a in args], tmp_path)
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert len(lines) == 1 and f"{flag}: cannot listen on {where}" in lines[0], stderr
