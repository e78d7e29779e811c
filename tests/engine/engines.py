"""Where the real engines are: `hack/build-engines.sh --print`, the one place
their versions and cache paths live. A missing engine fails the test loudly
(never a skip): CI builds them before the tests run."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "build-engines.sh"


@functools.cache
def engine_paths() -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(SCRIPT), "--print"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def require(name: str) -> Path:
    """The built engine part `name` (llama-server, llama-bench, ollama, model)."""
    path = Path(engine_paths()[name])
    if not path.exists():
        pytest.fail(
            f"the engine tests need {name} at {path}, which is missing. "
            f"Build the engines with: bash hack/build-engines.sh",
            pytrace=False,
        )
    return path


def ollama_version() -> str:
    """The built Ollama's version without the v: `0.34.4`."""
    versions = dict(v.split(":", 1) for v in engine_paths()["versions"].split())
    return versions["ollama"].removeprefix("v")
