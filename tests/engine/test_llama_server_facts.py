"""Engine facts about llama.cpp's llama-server, shown against the real one
(built by hack/build-engines.sh; docs/engine-facts.md names the sources).

One thread everywhere except the default-thread test, which lets the engine
pick (that is the fact under test) and stops it as soon as it has said how
many threads it took.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.engine.engines import require
from tests.engine.real_ollama import cpu_seconds, free_port, wait_idle

pytestmark = pytest.mark.engine

START_TIMEOUT = 120.0


def serve(
    log: Path, *args: str, preexec: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [
        str(require("llama-server")),
        "-m",
        str(require("model")),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-warmup",
        *args,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
            env={"PATH": "/usr/bin:/bin"},
        )
    return process, port


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait_for(check: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + START_TIMEOUT
    while not check():
        if process.poll() is not None:
            raise AssertionError(
                f"llama-server exited ({process.returncode}):\n"
                + log.read_text(errors="replace")[-3000:]
            )
        assert time.monotonic() < end, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running(log: Path, *args: str) -> Iterator[int]:
    process, port = serve(log, *args)
    try:
        wait_for(lambda: healthy(port), process, log)
        yield port
    finally:
        stop(process)


def test_quantized_v_cache_without_flash_attention_fails(tmp_path: Path) -> None:
    log = tmp_path / "off.log"
    process, _ = serve(log, "-t", "1", "-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off")
    try:
        rc = process.wait(timeout=START_TIMEOUT)
    finally:
        stop(process)
    assert rc != 0
    assert "quantized V cache requires flash_attn" in log.read_text(errors="replace")
    # Control: the same cache with flash attention on loads and serves.
    with running(
        tmp_path / "on.log", "-t", "1", "-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"
    ):
        pass


def _threads_taken(log: Path, process: subprocess.Popen[bytes]) -> int:
    # "system_info: n_threads = N" in older builds, "threadpool init, n_threads = N" in newer.
    pattern = re.compile(r"(?:system_info:|threadpool init,) n_threads = (\d+)")
    found: list[int] = []

    def said() -> bool:
        found[:] = [int(n) for n in pattern.findall(log.read_text(errors="replace"))]
        return bool(found)

    try:
        wait_for(said, process, log)
    finally:
        stop(process)
    return found[0]


def test_default_threads_ignore_cpuset_and_quota(tmp_path: Path) -> None:
    host = os.cpu_count() or 1
    assert host >= 2, "needs more than one host CPU to tell a restricted default apart"
    assert len(os.sched_getaffinity(0)) == host, "the test runner itself must see every CPU"

    # One allowed CPU (cpuset / affinity): the default still counts the host.
    process, _ = serve(
        tmp_path / "cpuset.log", "-c", "512", preexec=lambda: os.sched_setaffinity(0, {0})
    )
    assert psutil.Process(process.pid).cpu_affinity() == [0]
    assert _threads_taken(tmp_path / "cpuset.log", process) == host

    # A one-CPU cgroup quota: the default still counts the host.
    with cpu_quota_group(tmp_path, cpus=1) as join:
        process, _ = serve(tmp_path / "quota.log", "-c", "512", preexec=join)
        taken = _threads_taken(tmp_path / "quota.log", process)
    assert taken == host


@contextlib.contextmanager
def cpu_quota_group(tmp_path: Path, cpus: int) -> Iterator[Callable[[], None]]:
    """A cgroup with a CPU quota of `cpus`; yields a preexec function joining it.
    cgroup v2 (`cpu.max`) when the unified hierarchy has the cpu controller,
    else v1 (`cpu.cfs_quota_us`). Needs root; fails loudly without it."""
    name = f"localmodel-test-{os.getpid()}-{tmp_path.name}"
    v2 = Path("/sys/fs/cgroup")
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v2 / "cgroup.controllers").exists() and "cpu" in (
        v2 / "cgroup.subtree_control"
    ).read_text():
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{cpus * 100000} 100000")
        procs = group / "cgroup.procs"
    elif (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(cpus * 100000))
        procs = group / "tasks"
    else:
        pytest.fail("no writable cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us)")

    def join() -> None:
        procs.write_text(str(os.getpid()))

    try:
        yield join
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_non_streaming_caller_that_leaves_stops_llama_server(tmp_path: Path) -> None:
    """One slot, nothing else running: the abandoned non-streaming request is
    cancelled by llama-server's connection polling (about once a second)."""
    with running(tmp_path / "cancel.log", "-t", "1", "-c", "8192", "-np", "1") as port:
        engine = next(
            p
            for p in psutil.process_iter(["name"])
            if p.info["name"] == "llama-server" and f"--port {port}" in " ".join(p.cmdline())
        )
        body = json.dumps(
            {"prompt": "Once upon a time", "n_predict": 8000, "ignore_eos": True, "stream": False}
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        start = cpu_seconds(engine)
        deadline = time.monotonic() + 60
        while cpu_seconds(engine) - start < 1.0:  # well into decoding
            assert time.monotonic() < deadline, "llama-server never got busy"
            time.sleep(0.1)
        sock.close()
        # 8000 tokens on one thread take minutes; stopping within seconds is cancellation.
        idle_after = wait_idle(engine, timeout=15, window=0.5, busy=0.05)
        print(f"llama-server non-streaming disconnect: idle within {idle_after:.1f} s")
