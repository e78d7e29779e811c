"""Ollama's init step (operator/localmodel/engines/ollama/init.sh, with pull.sh or
from-gguf.sh), run for real by /bin/sh against a stand-in `ollama` CLI.

A small shell stand-in plays the CLI here, so the script's branches (including
a failing pull) run in milliseconds; the same script runs against the real
Ollama, offline, in tests/engines/test_ollama_pod.py. The stand-in serves
nothing, keeps "pulled" models as files in a directory like the real volume
would, and logs every call. What is under test
is our script's logic: pull only when the weights are missing, then build the
tuned model, and fail loudly when the pull fails.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from localmodel.desired import desired_state
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

STAND_IN = r"""#!/bin/sh
echo "$*" >> "$LOG"
case "$1" in
  serve) echo "$$" > "$STORE/../serve.pid"; exec sleep 30 ;;
  list) [ -f "$STORE/../serve.pid" ] ;;
  show) [ -f "$STORE/$(echo "$2" | tr ':/' '__')" ] ;;
  pull) [ -z "$FAIL_PULL" ] || exit 1; touch "$STORE/$(echo "$2" | tr ':/' '__')" ;;
  create) [ -f "$STORE/$(echo "$2" | tr ':/' '__')" ] && [ -f "$4" ] ;;
esac
"""


def init_script(tmp_path: Path, version: str = "0.32.2") -> str:
    model = MakeLocalModel("q").namespace(None).cpu(2).spec(engine={"version": version}).obj()
    node = MakeNode("n").cpus(8).cpu_flags({"AMXTILE"}).facts()
    pod = next(
        o for o in desired_state([model], [node], now="t").models[0].objects if o["kind"] == "Pod"
    )
    script: str = pod["spec"]["initContainers"][0]["command"][2]
    # The Modelfile is mounted at /etc/localmodel in the pod; point it at a temp copy.
    (tmp_path / "Modelfile").write_text("FROM qwen3:1.7b\n")
    return script.replace("/etc/localmodel/Modelfile", str(tmp_path / "Modelfile"))


def run(tmp_path: Path, script: str, **env: str) -> tuple[int, list[str]]:
    bin_dir, store, log = tmp_path / "bin", tmp_path / "store", tmp_path / "log"
    bin_dir.mkdir(exist_ok=True)
    store.mkdir(exist_ok=True)
    stub = bin_dir / "ollama"
    stub.write_text(STAND_IN)
    stub.chmod(0o755)
    # A server of this run writes it anew (`list` answers once it has, as the
    # real CLI answers once the server is up).
    (tmp_path / "serve.pid").unlink(missing_ok=True)
    proc = subprocess.run(
        ["/bin/sh", "-c", script],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "LOG": str(log),
            "STORE": str(store),
            "HOME": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, [c.split()[0] for c in calls]


def test_first_start_pulls_then_builds_the_tuned_model(tmp_path: Path) -> None:
    rc, calls = run(tmp_path, init_script(tmp_path))
    assert rc == 0
    # `serve` runs in the background, so its log line may land after `list`.
    assert calls.count("serve") == 1
    assert [c for c in calls if c not in ("serve", "list")] == ["show", "pull", "create"]


def test_restart_with_weights_present_never_pulls(tmp_path: Path) -> None:
    script = init_script(tmp_path)
    run(tmp_path, script)
    (tmp_path / "log").unlink()
    rc, calls = run(tmp_path, script)
    assert rc == 0
    assert [c for c in calls if c not in ("serve", "list")] == ["show", "create"]


def test_failed_pull_fails_the_pod_start(tmp_path: Path) -> None:
    rc, calls = run(tmp_path, init_script(tmp_path), FAIL_PULL="1")
    assert rc != 0
    assert "create" not in calls


def server_alive(tmp_path: Path) -> bool:
    """Whether the stand-in server this run started still runs (its pid may
    have gone to another process since: only a `sleep` is the server)."""
    pid = int((tmp_path / "serve.pid").read_text())
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_server_is_stopped_on_every_way_out(tmp_path: Path) -> None:
    """The background `ollama serve` never outlives the script: not after a
    failed pull (set -e exits there), not after success."""
    rc, calls = run(tmp_path, init_script(tmp_path), FAIL_PULL="1")
    assert rc != 0 and "pull" in calls
    assert not server_alive(tmp_path)
    rc, _ = run(tmp_path, init_script(tmp_path))
    assert rc == 0
    assert not server_alive(tmp_path)


def test_affected_version_removes_the_amx_library_first(tmp_path: Path) -> None:
    script = init_script(tmp_path, version="0.31.0")
    assert script.startswith("set -eu\nrm -f /usr/lib/ollama/libggml-cpu-sapphirerapids.so\n")
    assert os.path.exists("/bin/sh")
    rc, _ = run(tmp_path, script)
    assert rc == 0


ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "localmodel"


def test_every_script_file_ships_in_the_package() -> None:
    """The scripts are package data, read with importlib.resources: a file the
    wheel (and so the operator image) left out would fail every render there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["localmodel"]
    shipped = {p for g in globs for p in PACKAGE.glob(g)}
    scripts = {
        p
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix in (".sh", ".txt") and "__pycache__" not in p.parts
    }
    assert scripts, "no script files found"
    assert scripts <= shipped, f"not in package-data: {sorted(map(str, scripts - shipped))}"
