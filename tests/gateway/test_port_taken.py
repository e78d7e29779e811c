"""A program whose port is taken says so in one line naming its flag and the
address, and exits 2 (localmodel.settings.PortTaken): the router's --listen
and --admin-listen, the gateway's, and the operator's --metrics-listen and
--health-listen (`localmodel run`). The probe listens on nothing.

Each program runs as a subprocess (`python -m localmodel.cli`); the test
holds the port with a listening socket of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    return subprocess.run([sys.executable, "-m", "localmodel.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path, check=False)


def _free() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CASES = {
    "router --listen": (["router", "--replicas", "m=http://127.0.0.1:9", "--listen", "{held}",
                         "--admin-listen", "127.0.0.1:0"], "--listen"),
    "router --admin-listen": (["router", "--replicas", "m=http://127.0.0.1:9", "--listen",
                               "127.0.0.1:0", "--admin-listen", "{held}"], "--admin-listen"),
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
    where = f"127.0.0.1:{held}"
    done = _run([a.format(held=where, kubeconfig=kubeconfig, free=_free()) for a in args],
                tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and f"{flag}: cannot listen on {where}" in lines[0], done.stderr
