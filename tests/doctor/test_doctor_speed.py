"""doctor on a slow replica (doctor/speed.py) and on an engine still loading
(checks.local_findings; a cluster's pods: cluster.cluster_findings), as tables."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from localmodel.desired import desired_state
from localmodel.doctor.checks import EngineView, local_findings
from localmodel.doctor.cluster import ClusterView, cluster_findings
from localmodel.doctor.report import Verdict
from localmodel.doctor.speed import Watched, counters_moved, slow_findings, throttled_share
from localmodel.engines import llama_server
from localmodel.facts import NodeFacts
from localmodel.facts.machine import read_machine
from localmodel.facts.quantity import parse_bytes
from localmodel.podspec import expected_load_seconds, startup_bound_seconds
from tests.builders import (
    MakeLocalModel,
    MakeNode,
    by_kind_name,
    container_status,
    with_container_statuses,
)

pytestmark = pytest.mark.unit


def cadvisor(throttled: int, periods: int, pod: str = "chat-0", processes: int = 1) -> str:
    # The kubelet's text, with cAdvisor's trailing timestamps.
    labels = f'container="llama-server",namespace="ai",pod="{pod}"'
    return (
        "# TYPE container_cpu_cfs_periods_total counter\n"
        f"container_cpu_cfs_periods_total{{{labels}}} {periods} 1764626400000\n"
        "# TYPE container_cpu_cfs_throttled_periods_total counter\n"
        f"container_cpu_cfs_throttled_periods_total{{{labels}}} {throttled} 1764626400000\n"
        "# TYPE container_processes gauge\n"
        f"container_processes{{{labels}}} {processes} 1764626400000\n"
    )


def test_throttled_share_is_of_the_sampled_seconds_not_the_containers_life() -> None:
    # 1000 periods in its life with 10 throttled; then 30 periods, 24 throttled.
    assert throttled_share(cadvisor(10, 1000), cadvisor(34, 1030), "ai", "chat-0",
                           "llama-server") == pytest.approx(0.8)
    assert throttled_share(cadvisor(10, 1000), cadvisor(10, 1000), "ai", "chat-0",
                           "llama-server") is None
    assert throttled_share("not metrics {", cadvisor(1, 2), "ai", "chat-0", "x") is None


def test_counters_are_found_by_cgroup_id_when_cadvisor_left_the_names_empty() -> None:
    def unnamed(throttled: int, periods: int) -> str:
        labels = 'container="",id="/kubepods/podu1/abc123",namespace="",pod=""'
        return (f"container_cpu_cfs_periods_total{{{labels}}} {periods}\n"
                f"container_cpu_cfs_throttled_periods_total{{{labels}}} {throttled}\n")

    assert throttled_share(unnamed(0, 100), unnamed(9, 110), "ai", "chat-0", "llama-server",
                           "abc123") == pytest.approx(0.9)
    assert throttled_share(unnamed(0, 100), unnamed(9, 110), "ai", "chat-0",
                           "llama-server") is None


def last_seen(at: int) -> str:
    # cAdvisor stamps container_last_seen with the time of each read, so two
    # reads a second apart always differ as text.
    return (f'container_last_seen{{container="llama-server",namespace="ai",pod="chat-0"}} '
            f"{at} {at}000\n")


ENGINE = Watched("ai", "chat-0", "llama-server", "abc123")
OTHER = Watched("ai", "other-0", "llama-server", "def456")

MOVED_CASES = [
    # (case, before, after, watched, moved)
    ("only the read time changed: the same sample, not moved",
     cadvisor(10, 1000) + last_seen(1), cadvisor(10, 1000) + last_seen(4), [ENGINE], False),
    ("cAdvisor refreshed the container: moved",
     cadvisor(10, 1000) + last_seen(1), cadvisor(22, 1012) + last_seen(13), [ENGINE], True),
    ("another pod's counters moved, not the watched one's",
     cadvisor(10, 1000) + cadvisor(0, 50, pod="other-0"),
     cadvisor(10, 1000) + cadvisor(0, 60, pod="other-0"), [ENGINE, OTHER], False),
    ("both watched moved",
     cadvisor(10, 1000) + cadvisor(0, 50, pod="other-0"),
     cadvisor(11, 1010) + cadvisor(0, 60, pod="other-0"), [ENGINE, OTHER], True),
    ("a container the first sample lacks is not waited for",
     cadvisor(0, 50, pod="other-0"), cadvisor(0, 60, pod="other-0"), [ENGINE, OTHER], True),
    ("nothing watched", cadvisor(10, 1000), cadvisor(10, 1000), [], True),
]


@pytest.mark.parametrize(("case", "before", "after", "watched", "moved"), MOVED_CASES,
                         ids=[c[0] for c in MOVED_CASES])
def test_the_second_sample_is_taken_when_the_watched_counters_moved(
    case: str, before: str, after: str, watched: list[Watched], moved: bool
) -> None:
    assert counters_moved(before, after, watched) is moved


def chat_speed_status(slow: bool = True) -> dict[str, Any]:
    """The LocalModel `chat` as doctor reads it: its name and its replica's speed."""
    return {"metadata": {"namespace": "ai", "name": "chat"}, "status": {"placements": [{
        "replica": 0, "node": "n0", "pod": "chat-0", "threads": 1, "cpu": 1,
        "speed": {"slow": slow, "recentDecode": 8.1, "expectedDecode": 25.2,
                  "expectedSource": "own calibration", "calibrationDecode": 25.2}}]}}


def pod(name: str, node: str = "n0", cpu_limit: str | None = "1") -> dict[str, Any]:
    limits = {"cpu": cpu_limit} if cpu_limit else {}
    return {"metadata": {"namespace": "ai", "name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "limits": limits}}]}, "status": {"phase": "Running"}}


NODE = MakeNode("n0").cpus(2).memory_gib(8).with_facts(threads_per_core=1).facts()
SMT = MakeNode("n0").cpus(2).memory_gib(8).with_facts(threads_per_core=2).facts()
ONE_THREAD = {"ai/chat-0": (1, 1000, "llama-server", "abc123", "llama-server")}
EIGHT_THREADS = {"ai/chat-0": (8, 1000, "llama-server", "abc123", "llama-server")}
OLLAMA = {"ai/chat-0": (1, 1000, "llama-server", "abc123", "ollama")}
QUIET = {"n0": (cadvisor(0, 1000), cadvisor(0, 1030))}
THROTTLED = {"n0": (cadvisor(0, 1000), cadvisor(27, 1030))}
# Two busy processes joined the engine's container on a busy node: the
# container never reaches its quota (nothing throttled), the engine gets a
# third of what it got.
CROWDED = {"n0": (cadvisor(0, 1000, processes=3), cadvisor(1, 1100, processes=3))}

CASES = [
    # (case, cadvisor, threads, pods, node, the causes' words (after the headline))
    ("a CPU hog in the engine's container: throttling", THROTTLED, ONE_THREAD,
     [pod("chat-0")], NODE, ["CPU throttling: container llama-server was throttled in 90%"]),
    ("eight threads on one CPU: oversubscribed, throttled too", THROTTLED, EIGHT_THREADS,
     [pod("chat-0")], NODE, ["CPU throttling", "runs 8 threads on a CPU limit of 1"]),
    ("processes besides the engine in its container, not throttled: named",
     CROWDED, ONE_THREAD, [pod("chat-0")], NODE,
     ["container llama-server runs 3 processes where llama-server runs 1 (cAdvisor "
      "container_processes): the others share its CPU limit of 1"]),
    ("a throttled container crowded by other processes: both named",
     {"n0": (cadvisor(0, 1000, processes=2), cadvisor(25, 1030, processes=2))}, ONE_THREAD,
     [pod("chat-0")], NODE, ["CPU throttling", "runs 2 processes where llama-server runs 1"]),
    ("Ollama's server and its model's runner are its own", {"n0": (
        cadvisor(0, 1000, processes=2), cadvisor(0, 1030, processes=2))}, OLLAMA,
     [pod("chat-0")], NODE, ["no cause doctor can check was found"]),
    ("neighbours without a CPU limit", QUIET, ONE_THREAD,
     [pod("chat-0"), pod("batch", cpu_limit=None), pod("far", node="n1", cpu_limit=None)],
     NODE, ["1 other pod(s) on node n0 have no CPU limit (ai/batch)"]),
    ("SMT siblings", QUIET, ONE_THREAD, [pod("chat-0")], SMT,
     ["2 hardware threads per core"]),
    ("nothing doctor can check", QUIET, ONE_THREAD, [pod("chat-0")], NODE,
     ["no cause doctor can check was found"]),
    ("cAdvisor unreadable: said so", {"n0": PermissionError("403 Forbidden")}, ONE_THREAD,
     [pod("chat-0")], NODE,
     ["CPU throttling not checked: the kubelet's cAdvisor metrics of node n0 could not be "
      "read (403 Forbidden)"]),
    ("the counters did not move while read: not checked, not called unthrottled",
     {"n0": (cadvisor(5, 1000), cadvisor(5, 1000))}, ONE_THREAD, [pod("chat-0")], NODE,
     ["CPU throttling not checked: the CFS counters of container llama-server in the "
      "kubelet's cAdvisor metrics of node n0 did not move"]),
    ("no counters for the container: not checked",
     {"n0": (cadvisor(5, 1000, pod="x"), cadvisor(9, 1010, pod="x"))}, ONE_THREAD,
     [pod("chat-0")], NODE,
     ["CPU throttling not checked: the CFS counters of container llama-server in the "
      "kubelet's cAdvisor metrics of node n0 are not in them"]),
]


@pytest.mark.parametrize(("case", "samples", "threads", "pods", "node", "causes"), CASES,
                         ids=[c[0] for c in CASES])
def test_slow_replica_and_its_likely_causes(
    case: str, samples: Any, threads: Any, pods: list[dict[str, Any]], node: NodeFacts,
    causes: list[str],
) -> None:
    findings = slow_findings([chat_speed_status()], pods, {"n0": node}, threads, samples)
    head, *rest, memory = findings  # the node's memory last (tests/doctor/test_doctor_ceiling.py)
    assert "memory bandwidth was not measured" in memory.message
    assert head.check == "slow-replica" and head.verdict is Verdict.FAIL
    for words in ("ai/chat replica 0", "node n0", "8.1 tok/s", "expected 25.2 tok/s",
                  "own calibration"):
        assert words in head.message, head.message
    assert len(rest) == len(causes), [f.message for f in rest]
    for finding, words in zip(rest, causes, strict=True):
        assert words in finding.message, finding.message


def test_a_replica_not_slow_gets_no_finding() -> None:
    assert slow_findings([chat_speed_status(slow=False)], [], {}, {}, {}) == []


# Two host CPUs, no quota (the engine's own budget below is 1 CPU).
MACHINE = read_machine(
    Path(__file__).resolve().parents[1] / "fixtures" / "machines" / "recorded-2cpu-v1"
)


def test_a_loading_llama_server_is_not_called_absent_and_its_threads_are_judged() -> None:
    loading = EngineView(url=f"http://127.0.0.1:{llama_server.PORT}", kind=llama_server.NAME,
                         loading=True,
                         threads=8, threads_source="command line of pid 7",
                         process_budget=1.0, process_budget_why="pid 7: cgroup quota 1 CPUs")
    findings = local_findings(MACHINE, loading)
    engine = [f for f in findings if f.check == "engine"]
    assert len(engine) == 1 and "still loading its model" in engine[0].message
    assert "--engine-url" not in engine[0].fix
    threads = [f for f in findings if f.check == "threads"]
    assert threads and threads[0].verdict is Verdict.FAIL
    absent = local_findings(MACHINE, EngineView(url="http://127.0.0.1:9", error="refused"))
    assert "--engine-url" in next(f for f in absent if f.check == "engine").fix


@pytest.mark.parametrize(("ran", "verdict", "words"), [
    (None, Verdict.WARN, "load in about"),
    (1.0, Verdict.WARN, "load in about"),
    ("expected+1", Verdict.WARN, "slower than expected"),
    ("bound+1", Verdict.FAIL, "past the startup probe's bound"),
])
def test_a_loading_engine_is_judged_against_the_load_the_operator_expects(
        ran: float | str | None, verdict: Verdict, words: str) -> None:
    weights = 5 * 1024**3
    expected = expected_load_seconds(weights, llama_server.NAME)
    bound = startup_bound_seconds(expected)
    running = {"expected+1": expected + 1, "bound+1": bound + 1.0}.get(str(ran), ran)
    assert running is None or isinstance(running, float)
    loading = EngineView(url=f"http://127.0.0.1:{llama_server.PORT}", kind=llama_server.NAME,
                         loading=True, weights_bytes=weights, running_seconds=running)
    [engine] = [f for f in local_findings(MACHINE, loading) if f.check == "engine"]
    assert engine.verdict is verdict and words in engine.message
    # The numbers are the operator's own: the expected load and the probe's bound.
    assert f"about {expected:.0f} s" in engine.message and f"allow {bound} s" in engine.message


def _loading_pod(started: bool) -> dict[str, Any]:
    """The operator's llama-server pod as rendered and scheduled, its engine running since
    2026-12-01T00:00:00Z, its startup probe passed (`started`) or not."""
    model = (MakeLocalModel("g").spec(model="gemma3:270m").engine(llama_server.NAME)
             .gguf().cpu(1).obj())
    result = desired_state([model], [MakeNode("n1").cpu_flags({"AVX2"}).facts()],
                           now="2026-12-01T00:00:00Z").models[0]
    pod = by_kind_name(result.objects)["Pod/g-0"]
    pod["spec"]["nodeName"] = "n1"  # scheduled
    running = container_status(llama_server.NAME) | {"started": started}
    return with_container_statuses(pod, [running])


@pytest.mark.parametrize(("started", "after", "verdict"), [
    (False, "expected-1", None),
    (False, "expected+1", Verdict.WARN),
    (False, "bound+1", Verdict.FAIL),
    (True, "bound+1", None),  # its startup probe passed: loaded
])
def test_a_pod_loading_longer_than_its_weights_take_is_named(
        started: bool, after: str, verdict: Verdict | None) -> None:
    pod = _loading_pod(started)
    [engine] = [c for c in pod["spec"]["containers"] if c["name"] == llama_server.NAME]
    memory = parse_bytes(engine["resources"]["limits"]["memory"])
    expected = expected_load_seconds(memory, llama_server.NAME)
    bound = startup_bound_seconds(expected)
    ran = {"expected-1": expected - 1, "expected+1": expected + 1, "bound+1": bound + 1}[after]
    start = datetime.fromisoformat("2026-12-01T00:00:00Z").timestamp()
    _, findings = cluster_findings(ClusterView(nodes=[], pods=[pod],
                                               now=datetime.fromtimestamp(start + ran, UTC)))
    loading = [f for f in findings if f.check == "loading"]
    assert [f.verdict for f in loading] == ([] if verdict is None else [verdict])
    if loading:
        message = loading[0].message
        assert f"about {expected:.0f} s" in message and "/g-0 (gemma3:270m) on node n1" in message
    # Without the time of the reading nothing is judged.
    assert not [f for f in cluster_findings(ClusterView(nodes=[], pods=[pod]))[1]
                if f.check == "loading"]
