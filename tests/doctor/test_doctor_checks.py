"""doctor's pure checks (localmodel.doctor.checks) as tables: what was read in,
the finding's verdict and fix out. The reading (doctor/local.py) is tested
against real engines in tests/doctor."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from localmodel.doctor.checks import EngineView, default_engine_url, local_findings
from localmodel.doctor.report import Finding, Verdict
from localmodel.engines import llama_server, ollama
from localmodel.facts.machine import MachineFacts, read_machine

pytestmark = pytest.mark.unit

# Two host CPUs, two physical cores, no quota, no AMX.
MACHINE = read_machine(
    Path(__file__).resolve().parents[1] / "fixtures" / "machines" / "recorded-2cpu-v1"
)
AMX_MACHINE = replace(
    MACHINE, node=replace(MACHINE.node, cpu_flags=frozenset({"AMXTILE", "AMXINT8", "AVX2"}))
)


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, f"http://127.0.0.1:{ollama.PORT}"),
        ({"OLLAMA_HOST": "  "}, f"http://127.0.0.1:{ollama.PORT}"),
        ({"OLLAMA_HOST": "0.0.0.0"}, f"http://127.0.0.1:{ollama.PORT}"),
        ({"OLLAMA_HOST": "0.0.0.0:1234"}, "http://127.0.0.1:1234"),
        ({"OLLAMA_HOST": "gpu-box"}, f"http://gpu-box:{ollama.PORT}"),
        ({"OLLAMA_HOST": "https://ollama.example:8443"}, "https://ollama.example:8443"),
    ],
)
def test_default_engine_url_reads_ollama_host_as_ollama_does(env: dict[str, str], url: str) -> None:
    assert default_engine_url(env) == url


def view(kind: str, threads: int | None, budget: float | None, pid: int | None = 7) -> EngineView:
    return EngineView(
        url="http://127.0.0.1:1",
        kind=kind,
        threads=threads,
        threads_source="test" if threads is not None else "",
        pid=pid,
        process_budget=budget,
        process_budget_why="test budget" if budget is not None else "",
    )


def only(findings: list[Finding], check: str) -> Finding:
    [found] = [f for f in findings if f.check == check]
    return found


# (engine as read, verdict, words in the message, the fix)
THREADS: list[tuple[EngineView, Verdict, str, str]] = [
    (
        view(llama_server.NAME, 8, 1.0),
        Verdict.FAIL,
        "runs 8 threads",
        "start it with --threads 1 (-t 1)",
    ),
    (
        view(ollama.NAME, 8, 1.0),
        Verdict.FAIL,
        "runs 8 threads",
        "set PARAMETER num_thread 1 in the Modelfile (or options.num_thread 1)",
    ),
    (view(llama_server.NAME, 1, 1.0), Verdict.OK, "runs 1 threads", ""),
    (
        view(llama_server.NAME, 1, 2.0),
        Verdict.WARN,
        "runs 1 threads",
        "use 2 threads: the budget allows it",
    ),
    # No thread flag: llama-server takes the host's cores (2 here) on a budget of 1.
    (
        view(llama_server.NAME, None, 1.0),
        Verdict.FAIL,
        "without --threads",
        "start it with --threads 1",
    ),
    # ... on a budget of 2 that is not oversubscribed, but still unsaid.
    (
        view(llama_server.NAME, None, 2.0),
        Verdict.WARN,
        "without --threads",
        "start it with --threads 2",
    ),
    # Not running here (no pid): what it does is not visible.
    (
        view(llama_server.NAME, None, None, pid=None),
        Verdict.WARN,
        "not visible",
        "set PARAMETER num_thread 2 in the Modelfile (or options.num_thread)",
    ),
    # The engine's own budget unknown: this process's (2 CPUs) stands in.
    (
        view(ollama.NAME, 4, None),
        Verdict.FAIL,
        "runs 4 threads",
        "set PARAMETER num_thread 2 in the Modelfile (or options.num_thread 2)",
    ),
]


@pytest.mark.parametrize(("engine", "verdict", "words", "fix"), THREADS)
def test_thread_findings(engine: EngineView, verdict: Verdict, words: str, fix: str) -> None:
    finding = only(local_findings(MACHINE, engine), "threads")
    assert (finding.verdict, finding.fix) == (verdict, fix), finding
    assert words in finding.message


@pytest.mark.parametrize(
    ("machine", "kind", "version", "verdict"),
    [
        (AMX_MACHINE, ollama.NAME, "0.31.0", Verdict.FAIL),
        (AMX_MACHINE, ollama.NAME, None, Verdict.FAIL),  # unknown: the safe side
        (AMX_MACHINE, ollama.NAME, ollama.VERSION, None),  # the pinned version is fixed
        (AMX_MACHINE, llama_server.NAME, "b1", None),  # the crash is Ollama's build
        (MACHINE, ollama.NAME, "0.31.0", None),  # no AMX here
    ],
)
def test_amx_engine_findings(
    machine: MachineFacts, kind: str, version: str | None, verdict: Verdict | None
) -> None:
    engine = replace(view(kind, 2, 2.0), version=version)
    amx = [
        f for f in local_findings(machine, engine) if f.check == "amx" and f.verdict is Verdict.FAIL
    ]
    assert [f.verdict for f in amx] == ([verdict] if verdict else [])
    if verdict:
        assert "0.32.2" in amx[0].fix and "ollama#17205" in amx[0].message


@pytest.mark.parametrize(
    ("engine", "checks"),
    [
        (EngineView(url="http://x:1", error="refused"), ["engine", "cpu-budget", "amx"]),
        (
            view(ollama.NAME, 2, 2.0),
            ["models-per-node", "cancellation", "cpu-budget", "amx", "threads"],
        ),
        (view("gateway", 2, 2.0), ["models-per-node", "cpu-budget", "amx", "threads"]),
    ],
)
def test_findings_come_in_the_fields_order(engine: EngineView, checks: list[str]) -> None:
    assert [f.check for f in local_findings(MACHINE, engine)] == checks
