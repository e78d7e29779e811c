"""More models than nodes (issue 44) on kwok: what `benchmarks/idle.py --kwok` runs.

The e2e control plane (tests/harness/idle_standins.py `idle_plane`): the
real operator (`localmodel run` with the router named, yield grace GRACE_S),
the real router in this process, kwok nodes, and stand-in gateways at the
kwok pods' IPs whose clocks run PACE times the host's (a model sleeps after
`after` of its gateway's time: `after: 1m` is 60/PACE s of wall time) and
whose answers take ANSWER_S (in flight meanwhile). Two namespaces side by
side in the same run, each with M nodes (4 CPUs) and the same N models
(3 CPUs each: one per node): static (no `spec.idle`: M placed, the other
N - M never serve) and idle (`idle: {after: 1m, release: OnDemand,
holdSeconds: HOLD_S}`). The trace of benchmarks/idle.py (Poisson arrivals,
Zipf popularity) is sent through the router to both sides at the same wall
moments (its request lengths are not used: every answer takes ANSWER_S).

Counted per side: served (200) and refused, by the router's reason (expired
while held, hold full, other); wakes (`status.idle.wakes`; on the home node
or elsewhere by each `lastWake.warmCache`, read every second); held
requests and their waits (the router's signed `X-LocalModel-Woke` ms, as the
gateway got it); yields (closes a gateway accepted) and refused yields
(409); busy evictions (a close accepted, or a pod deleted, while its
stand-in had a request in flight): 0, or the run fails.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.idle_standins import JOURNEY, IdlePlane, add_nodes, idle_plane, router_args
from tests.harness.processes import wait_until

LM = "/apis/localmodel.dev/v1alpha1"
# Served names the built-in catalog knows (the planner sizes them); one per model.
SERVED = ("qwen3:0.6b", "qwen3:1.7b", "gemma3:270m", "gemma3:1b", "llama3.2:1b",
          "llama3.2:3b", "qwen3:4b", "gemma3:4b", "phi3:3.8b", "mistral:7b", "qwen3:8b",
          "gemma3:12b")
PACE = 4.0  # a stand-in gateway's seconds per wall second
ANSWER_S = 2.0  # a stand-in's answer time
GRACE_S = 5  # the operator's --yield-grace (its default is 30 s)
HOLD_S = 60  # spec.idle.holdSeconds
SETTLE_S = 240.0  # the longest wait for the placed models to be Ready (2 shared cores)
OPERATOR_ARGS = router_args("--unschedulable-seconds", "5", "--speed-interval", "1",
                            "--speed-idle-interval", "2", "--yield-grace", str(GRACE_S))
SIDES = ("static", "idle")


@dataclass(frozen=True)
class Call:
    """One request of the trace: when (seconds from the start) and which model (index)."""

    at: float
    model: int


def manifest(ns: str, index: int, idle: bool) -> dict[str, Any]:
    """Model `m<index>` of a side: 3 CPUs on that side's nodes; idle or not."""
    spec: dict[str, Any] = {"model": SERVED[index], "cpu": 3, "context": 4096,
                            "storage": {"retain": False, "size": "5Gi"},
                            "placement": {"nodeSelector": {JOURNEY: ns}}}
    if idle:
        spec["idle"] = {"after": "1m", "release": "OnDemand", "holdSeconds": HOLD_S}
    return MakeLocalModel(f"m{index}", ns).spec(**spec).manifest()


def ready_count(cluster: TestCluster, ns: str) -> int:
    items = cluster.api().get(f"{LM}/namespaces/{ns}/localmodels")["items"]
    return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (lm.get("status") or {}).get("conditions") or []) for lm in items)


class WakeLog:
    """Every wake each model showed (`status.idle.wakes`, and that wake's
    `lastWake.warmCache`), read every second in a thread of its own."""

    def __init__(self, cluster: TestCluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.warm: dict[tuple[str, int], bool] = {}  # (model, wake number) -> at home
        self.counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="wake-log", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.read()
            except Exception as exc:  # the API server's hiccup: read again
                print(f"wake log: {type(exc).__name__}: {exc}")

    def read(self) -> None:
        for lm in self.cluster.api().get(f"{LM}/namespaces/{self.ns}/localmodels")["items"]:
            idle = (lm.get("status") or {}).get("idle") or {}
            name, wakes = lm["metadata"]["name"], int(idle.get("wakes") or 0)
            self.counts[name] = max(wakes, self.counts.get(name, 0))
            last = idle.get("lastWake") or {}
            if wakes and last.get("warmCache") is not None:
                self.warm.setdefault((name, wakes), bool(last["warmCache"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.read()


def ask(url: str, model: str) -> tuple[int, str]:
    """A chat completion through the router: its status and body."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HOLD_S + 60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # a connection the router dropped: refused all the same
        return 0, f"{type(err).__name__}: {err}"


def drive(plane: IdlePlane, calls: Sequence[Call], sides: dict[str, str]) -> dict[
        str, list[tuple[int, str]]]:
    """Send every call to every side at its moment; every side's answers."""
    pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="caller")
    pending: dict[str, list[Future[tuple[int, str]]]] = {side: [] for side in sides}
    start = time.monotonic()
    for call in calls:
        time.sleep(max(0.0, start + call.at - time.monotonic()))
        for side, ns in sides.items():
            pending[side].append(pool.submit(ask, plane.router.url,
                                             f"{ns}/{SERVED[call.model]}"))
    answers = {side: [f.result(timeout=HOLD_S + 120) for f in futures]
               for side, futures in pending.items()}
    pool.shutdown()
    return answers


def tally(plane: IdlePlane, ns: str, answers: list[tuple[int, str]], wakes: WakeLog
          ) -> dict[str, Any]:
    """One side's counts (held waits as a list: idle.py reports their percentiles)."""
    standins = plane.gateways.in_namespace(ns)
    refused = [body for code, body in answers if code != 200]
    expired = sum("did not wake within" in b for b in refused)
    full = sum("--hold-per-model" in b for b in refused)
    home = sum(wakes.warm.values())
    return {
        "requests": len(answers), "served": len(answers) - len(refused),
        "refused": len(refused), "expired": expired, "full": full,
        "other_refused": len(refused) - expired - full,
        "wakes": sum(wakes.counts.values()), "wakes_home": home,
        "wakes_elsewhere": len(wakes.warm) - home,
        "held_s": sorted(ms / 1000 for s in standins for ms in s.held_ms),
        "yields": sum(s.closes for s in standins),
        "refused_yields": sum(s.refused for s in standins),
        "busy_evictions": sum(s.busy_closes for s in standins) + sum(
            s.namespace == ns for s in plane.gateways.evicted_busy),
    }


def router_log(line: str) -> None:
    """The router's log without its access lines (one per request: the counts say them)."""
    if not line.startswith('{"time"'):
        print(line)


def run_kwok(models: int, nodes: int, calls: Sequence[Call]) -> dict[str, dict[str, Any]]:
    """Both sides over the same calls on one kwok control plane: each side's counts."""
    with idle_plane(OPERATOR_ARGS, pace=PACE, answer_s=ANSWER_S, log_lines=40,
                    router_log=router_log) as plane:
        cluster, sides = plane.cluster, {}
        for side in SIDES:
            ns = f"bench-{side}"
            cluster.api().create("/api/v1/namespaces", {"metadata": {"name": ns}})
            plane.gateways.namespaces.add(ns)
            add_nodes(cluster, ns, *(f"n{i}" for i in range(nodes)))
            for i in range(models):
                cluster.api().create(f"{LM}/namespaces/{ns}/localmodels",
                                     manifest(ns, i, side == "idle"))
            sides[side] = ns
        for ns in sides.values():
            wait_until(f"{nodes} models Ready in {ns}",
                       lambda ns=ns: ready_count(cluster, ns) >= nodes, timeout=SETTLE_S)
        logs = {side: WakeLog(cluster, ns) for side, ns in sides.items()}
        try:
            answers = drive(plane, calls, sides)
        finally:
            for log in logs.values():
                log.stop()
        return {side: tally(plane, ns, answers[side], logs[side]) for side, ns in sides.items()}
