"""Where the pinned control-plane binaries live, and the cache they are built into.

`hack/build-tools.sh` holds the only copy of the version pins; it prints the
path of every binary with `--print`, so the harness never repeats a version
(tests/harness/engines.py reads `hack/build-engines.sh --print` the same way).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"


def cache_dir() -> Path:
    """Where hack/build-*.sh cache what they build (and `python -m tests.harness`
    keeps its state): $LOCALMODEL_CACHE, else ~/.cache/localmodel-operator."""
    default = Path.home() / ".cache" / "localmodel-operator"
    return Path(os.environ.get("LOCALMODEL_CACHE") or default)


TOOL_NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwok-stages",  # kwok's default Stage objects (a YAML file, not a binary)
    "helm",
    "kubeconform",
)


class ToolsMissingError(RuntimeError):
    """A binary the harness needs is not built; the message says how to build it."""


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the pinned binaries, plus the versions they were built at."""

    paths: dict[str, Path]
    versions: dict[str, str]

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]

    @property
    def kubernetes_version(self) -> str:
        return self.versions["kubernetes"]


def parse_print_output(text: str) -> Tools:
    """Parse `build-tools.sh --print` (`name=path` lines and one `versions=` line)."""
    paths: dict[str, Path] = {}
    versions: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        if name == "versions":
            for item in value.split():
                tool, _, version = item.partition(":")
                versions[tool] = version
        else:
            paths[name] = Path(value)
    return Tools(paths=paths, versions=versions)


def _usable(path: Path) -> bool:
    if path.suffix == ".yaml":
        return path.is_file() and path.stat().st_size > 0
    return os.access(path, os.X_OK)


def print_output(
    script: Path,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    timeout: float = 60,
) -> str:
    """What `bash SCRIPT --print [ARGS...]` writes (the script builds nothing then);
    `env`: its whole environment (default: ours)."""
    return subprocess.run(
        ["bash", str(script), "--print", *args],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ.copy() if env is None else env,
        timeout=timeout,
    ).stdout


SYNTH_SCRIPT = REPO_ROOT / "hack" / "synth-gguf.py"


def synth_paths(*shapes: str, timeout: float = 120) -> dict[str, Path]:
    """Where `hack/synth-gguf.py --print SHAPE...` caches each synthetic GGUF
    (written or not): shape -> path. The script needs the cached 270M GGUF (its
    tokenizer): without it, no paths."""
    done = subprocess.run(
        [sys.executable, str(SYNTH_SCRIPT), "--print", *shapes],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    return parse_print_output(done.stdout).paths if done.returncode == 0 else {}


def locate_tools(required: tuple[str, ...] = TOOL_NAMES) -> Tools:
    """Find the pinned binaries; raise ToolsMissingError naming any that are absent."""
    try:
        out = print_output(BUILD_SCRIPT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolsMissingError(f"cannot run {BUILD_SCRIPT} --print: {exc}") from exc
    tools = parse_print_output(out)
    missing = [
        f"{name} ({tools.paths.get(name, '?')})"
        for name in required
        if name not in tools.paths or not _usable(tools.paths[name])
    ]
    if missing:
        raise ToolsMissingError(
            "control-plane binaries are not built: "
            + ", ".join(missing)
            + f"; run `bash {BUILD_SCRIPT.relative_to(REPO_ROOT)}` (cold build: 10-30 min)"
        )
    return tools
