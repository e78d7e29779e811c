"""Waking a sleeping model, the paths side by side on the real node's machine
(issue 44's "the wake path, chosen by measurement"; docs/benchmarks.md,
Waking a sleeping model).

- The engines' own paths, `benchmarks/wake.py --quick` (llama-server's
  `--sleep-idle-seconds`, Ollama's `keep_alive: 0`, the awake floor), warm and
  cold page cache, with what stays resident while asleep.
- The pod re-created: a llama-server model with `idle: {after: 1m, release:
  WhenAsleep}` put to sleep and woken through the router LOCALMODEL_WAKES
  times warm and cold in turn (cold: the GGUF in its home volume's host
  directory dropped from the page cache); CI wakes it once, cold (the idle
  journey in the same phase times a warm wake). Each wake is timed step by
  step (tests/realnode/test_idle_on_node.py's watch), from the request to
  its first token.
- An in-place resize of the woken, Guaranteed pod (its engine's CPU and memory
  halved through the `resize` subresource), and what the kubelet said of it
  (`status.resize`, the PodResize conditions, the container's resources).

What it asserts is what noise cannot turn around: every path answered every
run, a request to an awake engine is faster than any wake, and a sleeping
engine holds less memory than an awake one. The numbers are printed as
`[timing]` lines and a table, for docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest

from benchmarks.wake import COLD, QUICK_RUNS, WARM, drop_from_page_cache, measure, table
from localmodel.engines import llama_server
from localmodel.facts.quantity import parse_bytes
from tests.harness.engines import MODEL_TAG
from tests.harness.processes import wait_for
from tests.realnode.journey import MODEL_NAMESPACE, Journey, Manifest
from tests.realnode.test_idle_on_node import (
    SLEEPER,
    idle_model,
    listed,
    router,  # noqa: F401 (the fixture)
    wait_asleep,
    wake_through_router,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

# Each wake first waits out the minute of idleness. docs/benchmarks.md's
# medians are of LOCALMODEL_WAKES=3 (three warm and three cold); without it
# (CI) the pod is woken once, cold: test_idle_on_node.py times a warm wake.
WAKES = int(os.environ.get("LOCALMODEL_WAKES", "0"))
CACHES = (WARM, COLD) if WAKES else (COLD,)


def test_the_engines_wake_paths_side_by_side(journey: Journey) -> None:
    out = measure(QUICK_RUNS, journey.cluster.workdir / "wake-bench")
    journey.timings.add("benchmarks/wake.py --quick", out["seconds"])
    print(f"load average before {out['load_before']}, after {out['load_after']}")
    print(table(out["rows"]))
    print(json.dumps(out))
    rows = {(r["path"], r["cache"]): r for r in out["rows"]}
    assert all(r["runs"] == QUICK_RUNS for r in out["rows"]), out
    floor = rows[("llama-server awake", "warm")]
    for (path, cache), r in rows.items():
        journey.timings.add(f"wake path {path} ({cache}): median to the first token",
                            r["median"])
        if path != floor["path"]:
            assert r["min"] > floor["max"], (path, cache, r, floor)
    # llama-server asleep frees its weights and KV: less resident than awake.
    assert rows[("llama-server --sleep-idle-seconds", "warm")]["asleep_mib"] < floor["asleep_mib"]


@pytest.mark.llama  # llama-server only: runs while Ollama builds (hack/test.sh)
def test_the_pod_recreated_wake_timed_and_an_in_place_resize(
    journey: Journey, router: str  # noqa: F811 (the imported fixture)
) -> None:
    journey.deploy(idle_model(journey, SLEEPER))
    wait_for("the router to list the model", lambda: MODEL_TAG in listed(router), 60,
             interval=0.5)
    firsts: dict[str, list[float]] = {cache: [] for cache in CACHES}
    for i in range(max(WAKES, 1)):
        for cache in CACHES:
            lm = wait_asleep(journey, SLEEPER)
            cached = home_weights_dropped(journey, lm) if cache == COLD else None
            print(f"wake {i + 1} ({cache}): the weights' pages cached: {cached}")
            firsts[cache].append(journey.timings.add(
                f"wake {i + 1} ({cache}): the pod re-created, request -> first token",
                wake_through_router(journey, router)))
    for cache, seconds in firsts.items():
        print(f"the pod re-created ({cache}): median {statistics.median(seconds):.2f} s, "
              f"min {min(seconds):.2f} s, max {max(seconds):.2f} s over {len(seconds)} wakes: "
              + ", ".join(f"{s:.2f}" for s in seconds))
        assert len(seconds) == max(WAKES, 1) and all(s > 0 for s in seconds)
    resize_in_place(journey, journey.pod_of(SLEEPER))


def home_weights_dropped(journey: Journey, lm: Manifest) -> float:
    """Drop the GGUF in the sleeping model's home volume (its host directory on
    the real node) from the page cache; the fraction still cached after."""
    claim = lm["status"]["idle"]["homes"][0]["claim"]
    pvc = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}/persistentvolumeclaims/{claim}")
    pv = journey.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
    ggufs = sorted(Path(pv["spec"]["local"]["path"]).rglob("*.gguf"))
    assert ggufs, pv["spec"]
    return drop_from_page_cache(ggufs)


def resize_in_place(journey: Journey, pod: Manifest) -> None:
    """Halve the engine's CPU and memory in place; print what the kubelet said."""
    name = pod["metadata"]["name"]
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == llama_server.NAME)
    print(f"{name}: qosClass {pod['status'].get('qosClass')}, engine resources "
          f"{engine['resources']}")
    print(journey.kubectl("version", check=False))
    for what, half in (("cpu", "500m"), ("memory", None)):
        if half is None:
            half = str(int(_bytes(engine["resources"]["limits"]["memory"]) // 2))
        patch = {"spec": {"containers": [{"name": llama_server.NAME, "resources": {
            "requests": {what: half}, "limits": {what: half}}}]}}
        answer = journey.cluster.kubectl(
            "patch", "pod", name, "-n", MODEL_NAMESPACE, "--subresource", "resize",
            "--patch", json.dumps(patch), check=False)
        print(f"resize {what} -> {half}: rc {answer.returncode} "
              f"{(answer.stdout + answer.stderr).strip()[:600]}")
        time.sleep(10)  # what the kubelet did with it by then is what is printed
        now = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}/pods/{name}")
        status = now.get("status") or {}
        conditions = [c for c in status.get("conditions") or [] if "Resize" in c.get("type", "")]
        engines = [s for s in status.get("containerStatuses") or []
                   if s["name"] == llama_server.NAME]
        print(f"  status.resize {status.get('resize')!r}, conditions {conditions}, "
              f"engine status resources {[s.get('resources') for s in engines]}, "
              f"allocated {[s.get('allocatedResources') for s in engines]}, "
              f"restarts {[s.get('restartCount') for s in engines]}, "
              f"pod uid same {now['metadata']['uid'] == pod['metadata']['uid']}")


def _bytes(quantity: str) -> float:
    return float(parse_bytes(quantity))
