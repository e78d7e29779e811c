"""One way to start, wait for and stop a process in tests and benchmarks.

tests/harness/processes.py starts every child process (ManagedProcess), signals
and stops it, and picks free ports; tests/harness/engines.py finds the built
engines (`hack/build-engines.sh --print`) and starts them through it;
tests/harness/tools.py knows the cache directory and runs the build scripts'
`--print`. Code in tests/ or benchmarks/ that does any of that itself fails
here, listed as file:line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.architecture import codebase

pytestmark = pytest.mark.unit

ROOT = codebase.ROOT
PROCESSES = "tests/harness/processes.py"
TOOLS = "tests/harness/tools.py"

# What may be done in one place only: the pattern that finds it, and its home.
ONE_HOME: dict[str, tuple[re.Pattern[str], str]] = {
    "starts a process": (
        re.compile(
            r"\bPopen\(|create_subprocess_(exec|shell)|os\.(fork|spawn\w*|exec\w*)\("
            r"|multiprocessing\.Process|\bpexpect\b"
        ),
        PROCESSES,
    ),
    "signals a process": (
        re.compile(r"\bos\.kill(pg)?\(|\.send_signal\(|\.terminate\(\)"),
        PROCESSES,
    ),
    "picks a free port": (
        re.compile(r"\bdef free_ports?\b|\.bind\(\(\s*[\"'][\d.]+[\"']\s*,\s*0\s*\)\)"),
        PROCESSES,
    ),
    "names the cache directory": (
        re.compile(r"[\"']\.cache[\"']|\.cache/localmodel|LOCALMODEL_CACHE"),
        TOOLS,
    ),
    "runs a build script's --print": (re.compile(r"[\"']--print[\"']"), TOOLS),
}

# (file, what) -> why that file may do it too. Keep this short and give reasons.
ALLOWED: dict[tuple[str, str], str] = {
    ("benchmarks/start.py", "runs a build script's --print"):
        "hack/synth-gguf.py --print names the synthetic models it caches, writing nothing; "
        "it is a Python script, and tools.print_output runs bash scripts",
}


def sources() -> list[Path]:
    here = Path(__file__).resolve()
    files = [*codebase.files(ROOT / "tests", "*.py"), *codebase.files(ROOT / "benchmarks", "*.py")]
    return [f for f in files if f.resolve() != here]


def offenders(what: str) -> list[str]:
    pattern, home = ONE_HOME[what]
    found = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel == home or (rel, what) in ALLOWED:
            continue
        for number, line in enumerate(codebase.text(path).splitlines(), 1):
            if pattern.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("what", sorted(ONE_HOME))
def test_only_its_home_does_it(what: str) -> None:
    found = offenders(what)
    home = ONE_HOME[what][1]
    assert not found, (
        f"only {home} {what} in tests/ and benchmarks/ (use it, or add an entry with a "
        f"reason to ALLOWED in {Path(__file__).name}):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("what", sorted(ONE_HOME))
def test_the_home_really_does_it(what: str) -> None:
    """The patterns find what they look for: each home holds a match (a pattern
    that matches nothing would pass the test above for the wrong reason)."""
    pattern, home = ONE_HOME[what]
    assert pattern.search((ROOT / home).read_text()), f"{home} no longer {what}: fix ONE_HOME"


def test_allowed_entries_are_still_needed() -> None:
    for (rel, what), reason in ALLOWED.items():
        pattern = ONE_HOME[what][0]
        text = (ROOT / rel).read_text(errors="replace")
        assert pattern.search(text), f"{rel} no longer {what}; drop ALLOWED entry ({reason})"


def test_a_stray_launcher_is_found(tmp_path: Path) -> None:
    """The scan on a line that starts, signals and binds the way the harness does."""
    stray = [
        "proc = subprocess.Popen([binary, 'serve'])",
        "proc.send_signal(signal.SIGTERM)",
        "    s.bind(('127.0.0.1', 0))",
        'CACHE = Path.home() / ".cache" / "localmodel-operator"',
        'subprocess.run(["bash", str(script), "--print"])',
    ]
    hits = {what for line in stray for what, (p, _) in ONE_HOME.items() if p.search(line)}
    assert hits == set(ONE_HOME)
