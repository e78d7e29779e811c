"""The router as a real process (`localmodel router`, in front of the Ollama
stand-in, not Ollama) while every place but one is held by a client sending
the worst bodies: benchmarks/router_hostile.py --quick runs it and this
checks what it reports. Every refused body gets its 4xx naming its limit,
every relayed one the replica's answer, the normal caller's chats are all
answered meanwhile, the router lives, and its peak RSS stays under the
chart's limit (it measured about 139 MiB of 256; before admission, 24
concurrent 1 MiB bodies took it to 673 MiB). The number itself is the
benchmark's, for docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from localmodel.router.config import router_memory_bytes
from tests.benchmarks.test_quick_modes import last_json, run_benchmark


def test_every_place_held_by_hostile_bodies_stays_under_the_charts_memory_limit(
    tmp_path: Path,
) -> None:
    report = last_json(
        run_benchmark(tmp_path, "router_hostile.py", "--quick", "--json", timeout=300)
    )
    assert report["quick"] and report["places"] == 64 and report["hostile_clients"] == 63
    assert report["chart_limit_mib"] * 1024**2 == router_memory_bytes()
    assert report["router_alive"]
    kinds = {key.split(":")[0] for key in report["hostile"]}
    assert kinds == {"structure", "messages", "string", "nesting", "oversize"}, report
    assert report["hostile_as_they_must_be"] == report["hostile_sent"] >= 63, report
    assert set(report["normal_statuses"]) == {"200"}, report["normal_statuses"]
    assert report["normal_statuses"]["200"] >= 1
    assert report["rss_peak_mib"] < report["chart_limit_mib"], report
