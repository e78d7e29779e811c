"""Memory that holds for weeks, on the real node: a llama-server model pod, as
the operator renders it (one CPU, `memory: auto` with its prompt-cache term),
serves PROMPTS distinct long prompts through its Service and its engine
container stays under its memory limit, never OOM-killed or restarted, while
the engine's host-memory prompt cache is crossed again and again (its log says
how often it dropped its oldest entry).

Without the bound the same pod would not hold: each of these prompts keeps a
state of about 10 MiB (docs/engine-facts.md#the-prompt-cache-in-host-memory)
and llama-server's default bound is 8192 MiB, so the container would pass its
limit after about 150 prompts (benchmarks/prompt_cache.py measures the
unbounded growth with the local engines). The container's memory cgroup usage
over time is printed as a table (docs/benchmarks.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localmodel.engines import llama_server
from localmodel.facts.quantity import parse_bytes
from tests.realnode.journey import Deployed, Journey, container_cgroup, http_json

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-cache"
ENGINE = llama_server.NAME
PROMPTS = 200  # unbounded, the pod would pass its limit after about 150 (docs/benchmarks.md)
WORDS = 250  # about 300 tokens with the chat template: a state of about 10 MiB
PROMPT_CACHE = "64Mi"  # holds about six such states
CONTEXT = 2048
VOCABULARY = [
    "river", "stone", "lantern", "orbit", "maple", "quartz", "harbor", "violet", "ember",
    "falcon", "meadow", "cobalt", "thunder", "willow", "copper", "glacier", "saffron",
    "canyon", "whisper", "beacon", "marble", "tundra", "velvet",
]


def prompt(tag: int) -> str:
    words = [VOCABULARY[(tag * 31 + i * (tag % 7 + 1)) % len(VOCABULARY)] for i in range(WORDS)]
    return f"Request {tag}: " + " ".join(words)


@pytest.fixture(scope="module")
def cached(journey: Journey) -> Iterator[Deployed]:
    manifest = journey.local_model(NAME, ENGINE, context=CONTEXT)
    manifest["spec"]["promptCache"] = PROMPT_CACHE
    deployed = journey.deploy(manifest)
    try:
        yield deployed
    finally:
        journey.delete_model(NAME)


def memory_reader(group: Path) -> tuple[Path, Path]:
    """The cgroup's usage and its high-water mark (v1, or v2 where it has a peak)."""
    if (group / "memory.usage_in_bytes").exists():
        return group / "memory.usage_in_bytes", group / "memory.max_usage_in_bytes"
    return group / "memory.current", group / "memory.peak"


def test_a_pod_serving_hundreds_of_distinct_long_prompts_stays_under_its_limit(
    journey: Journey, cached: Deployed
) -> None:
    pod = journey.pod_of(NAME)
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == ENGINE)
    args = engine["args"]
    assert args[args.index("--cache-ram") + 1] == "64", args
    limit = parse_bytes(engine["resources"]["limits"]["memory"])
    usage, peak = memory_reader(container_cgroup("memory", pod, ENGINE))
    rows: list[tuple[int, float, int, int]] = []
    began = time.monotonic()
    with journey.port_forward(f"svc/{NAME}") as url:
        for tag in range(PROMPTS):
            status, doc = http_json(f"{url}/v1/chat/completions", {
                "model": "gemma3:270m", "max_tokens": 1,
                "messages": [{"role": "user", "content": prompt(tag)}]}, timeout=600)
            assert status == 200, (tag, status, doc)
            if tag % 20 == 19 or tag == 0:
                rows.append((tag + 1, time.monotonic() - began, int(usage.read_text()),
                             int(peak.read_text()) if peak.exists() else 0))
    after = journey.pod_of(NAME)
    assert after["metadata"]["uid"] == pod["metadata"]["uid"], "the pod was replaced"
    status = next(s for s in after["status"]["containerStatuses"] if s["name"] == ENGINE)
    evictions = journey.logs(after["metadata"]["name"], ENGINE).count("removing oldest entry")
    mib = 2**20
    print(f"\nlimit {limit // mib} MiB; {PROMPTS} prompts of {WORDS} words; promptCache "
          f"{PROMPT_CACHE}; the cache dropped its oldest entry {evictions} times")
    print("| prompts | s | engine container memory (MiB) | peak (MiB) |\n|---:|---:|---:|---:|")
    for n, s, used, high in rows:
        print(f"| {n} | {s:.0f} | {used / mib:.0f} | {high / mib:.0f} |")
    assert status["restartCount"] == 0, status
    assert "lastState" not in status or not status["lastState"].get("terminated"), status
    assert evictions >= PROMPTS // 2, f"the bound was crossed only {evictions} times"
    highest = max(max(used, high) for _, _, used, high in rows)
    assert highest < limit, f"peak {highest / mib:.0f} MiB, limit {limit // mib} MiB"
