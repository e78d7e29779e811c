"""The gateway as a real process (`localmodel gateway`, in front of the Ollama
stand-in, not Ollama) while the worst bodies arrive at the queue's full depth:
benchmarks/gateway_hostile.py --quick runs it and this checks what it reports.
Every hostile request gets its 4xx naming the limit, every valid one held in
the queue its answer, the normal caller's chats are all answered meanwhile,
the gateway lives, and its peak RSS stays under the rendered gateway memory
limit with a generous margin (it measured about 103 MiB of 256; before
admission and the caps, four 8 MiB bodies took it to 481 MiB). The
number itself is the benchmark's, for docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from localmodel.render.names import gateway_memory_bytes
from tests.benchmarks.test_quick_modes import last_json, run_benchmark


def test_hostile_bodies_at_the_queues_full_depth_stay_under_the_pods_memory_limit(
    tmp_path: Path,
) -> None:
    report = last_json(
        run_benchmark(tmp_path, "gateway_hostile.py", "--quick", "--json", timeout=300)
    )
    # The pod's rendered settings (examples/qwen3.yaml): one slot, maxQueue 16,
    # every place but the normal caller's held by a hostile client.
    assert report["quick"] and (report["slots"], report["max_queue"]) == (1, 16)
    assert report["hostile_clients"] == 16
    assert report["pod_limit_mib"] * 1024**2 == gateway_memory_bytes(1, 16)
    assert report["gateway_alive"]
    kinds = {key.split(":")[0] for key in report["hostile"]}
    assert kinds == {"messages", "string", "nesting", "oversize", "queued"}, report["hostile"]
    # Each one refused with its status, naming its limit; each valid one
    # answered after its wait in the queue (nothing else counted).
    assert report["hostile_refused"] >= 16
    assert report["hostile_refused_naming_the_limit"] == report["hostile_refused"], report
    assert report["queued_answered"] == report["queued_sent"] >= 1, report
    assert set(report["normal_statuses"]) == {"200"}, report["normal_statuses"]
    assert report["normal_statuses"]["200"] >= 1
    assert report["rss_peak_mib"] < report["pod_limit_mib"], report
