"""`localmodel doctor --local` on this machine, as a process, against a REAL
llama-server (built by hack/build-engines.sh, serving Gemma 3 270M) inside a
REAL 1-CPU cgroup quota (created here as root; v2 or v1, whichever this machine
has). Nothing stands in: the budget, the engine's thread count (its command line)
and the quota are all read by doctor from the running system.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cgroup import CgroupUnavailableError, cpu_quota_cgroup
from tests.harness.engines import llama_server

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

REPO = Path(__file__).resolve().parents[2]


def doctor(*args: str, preexec: Callable[[], None] | None = None) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    env.pop("OLLAMA_HOST", None)
    result = subprocess.run(
        [sys.executable, "-m", "localmodel.cli", "doctor", "--local", "-o", "json", *args],
        capture_output=True, text=True, timeout=120, env=env, preexec_fn=preexec,
    )
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def own_quota() -> float | None:
    """This test process's own cgroup CPU quota, read independently of the code under test
    (its own cgroup only; nested limits are the unit tier's business)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            cpu_max = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max"
            if cpu_max.exists():
                quota, period = cpu_max.read_text().split()
                if quota != "max":
                    return int(quota) / int(period)
        elif "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            quota_file = base / "cpu.cfs_quota_us"
            if quota_file.exists() and int(quota_file.read_text()) > 0:
                return int(quota_file.read_text()) / int((base / "cpu.cfs_period_us").read_text())
    return None


def by_check(report: dict[str, Any], check: str) -> list[dict[str, str]]:
    return [f for f in report["findings"] if f["check"] == check]


def test_reports_this_machines_real_cpu_budget() -> None:
    status, report = doctor("--engine-url", "http://127.0.0.1:9")  # nothing listens there
    facts = report["facts"]
    expected = float(min(os.cpu_count() or 1, len(os.sched_getaffinity(0))))
    quota = own_quota()
    if quota is not None:
        expected = min(expected, quota)
    print(f"\ndoctor --local here: cpu_budget={facts['cpu_budget']} host_cpus={facts['host_cpus']}")
    assert facts["host_cpus"] == os.cpu_count()
    assert facts["cpu_budget"] == pytest.approx(expected, abs=0.001)
    [engine] = by_check(report, "engine")
    assert engine["verdict"] == "warn" and "127.0.0.1:9" in engine["message"]
    assert status == 0  # warnings only, no --strict


def test_eight_threads_in_a_one_cpu_quota_are_flagged_with_a_fix_naming_one(
    tmp_path: Path,
) -> None:
    eight_threads = ["-c", "512", "-np", "1", "-t", "8", "--metrics", "--no-warmup"]
    try:
        with cpu_quota_cgroup(cpus=1) as group, llama_server(
            tmp_path, eight_threads, preexec=group.join
        ) as engine:
            status, report = doctor("--engine-url", engine.url, preexec=group.join)
            strict, _ = doctor("--engine-url", engine.url, "--strict", preexec=group.join)
    except CgroupUnavailableError as e:
        pytest.fail(str(e), pytrace=False)
    facts = report["facts"]
    print(f"\ndoctor --local in a 1-CPU quota: {json.dumps(report['findings'], indent=1)}")
    assert facts["cpu_budget"] == 1.0
    assert facts["cgroup_cpu_quota"] == 1.0
    assert facts["host_cpus"] == os.cpu_count()
    assert facts["engine"]["kind"] == "llama-server"
    assert facts["engine"]["threads"] == 8
    assert facts["engine"]["cpu_budget"] == 1.0  # the engine's own cgroup, read by pid
    [threads] = by_check(report, "threads")
    assert threads["verdict"] == "fail"
    assert "runs 8 threads" in threads["message"] and "CPU budget of 1" in threads["message"]
    assert threads["fix"] == "start it with --threads 1 (-t 1)"
    [budget] = by_check(report, "cpu-budget")
    assert "should run 1 thread" in budget["message"]
    assert status == 2 and strict == 2


def test_a_loading_llama_server_is_reported_loading_not_absent(tmp_path: Path) -> None:
    """llama-server listens before it loads and answers 503 until loaded; under
    oversubscribed threads the load takes long (16 threads on one CPU here:
    tens of seconds), which is when a person runs doctor."""
    import time
    import urllib.error
    import urllib.request

    from localmodel.engines import llama_server as engine_facts
    from tests.harness.engines import start_llama_server

    def health() -> int:
        try:
            with urllib.request.urlopen(engine.url + engine_facts.HEALTH_PATH, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    sixteen = ["-c", "512", "-np", "1", "-t", "16", "--metrics", "--no-warmup"]
    try:
        with cpu_quota_cgroup(cpus=1) as group:
            engine = start_llama_server(tmp_path, sixteen, preexec=group.join)
            try:
                end = time.monotonic() + 60
                while health() != engine_facts.LOADING_STATUS:
                    assert time.monotonic() < end, "llama-server never answered 503 (loading)"
                    time.sleep(0.1)
                status, report = doctor("--engine-url", engine.url, preexec=group.join)
                still_loading = health() == engine_facts.LOADING_STATUS
            finally:
                engine.stop()
    except CgroupUnavailableError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\ndoctor --local on a loading llama-server: {json.dumps(report['findings'], indent=1)}")
    assert still_loading, "the engine finished loading before doctor did: nothing was shown"
    [found] = by_check(report, "engine")
    assert "still loading its model" in found["message"] and engine.url in found["message"]
    assert "--engine-url" not in found["fix"]
    assert report["facts"]["engine"]["loading"] is True
    assert report["facts"]["engine"]["threads"] == 16
    [threads] = by_check(report, "threads")
    assert threads["verdict"] == "fail"
    assert status == 2
