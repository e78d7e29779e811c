"""The headline in a real pod: the operator's threads against the engine's default,
8 threads and a sweep, each a real pod under the same kubelet-set CPU limit.

`benchmarks/threads.py` holds the operator's thread count against the others in
a bare cgroup; this does it where models are served. One run, on the real node
of tests/harness (a real kubelet, containerd and runc enforcing the pod's CPU
limit as CFS quota):

1. A llama-server LocalModel for the cached Gemma 3 270M GGUF with `cpu: 1` is
   planned onto the real node (its Node object: the node facts the operator
   reads) and rendered offline, exactly as the operator would (`desired_state`):
   its claim, and its pod with the download step, the engine with the rules'
   arguments and the gateway sidecar. No operator runs: the benchmark applies
   the objects itself, so it can change one thing per point.
2. Each point is that pod with only the engine's `-t/-tb` changed: the
   operator's (the rules' choice), none (the engine's default: the host's
   physical cores, 2 here; the count it took is read from its log), 8 (the
   field report's collapse: 8x the limit) and a sweep from 1 to 2x the limit
   but the operator's own count (the same command). Every point keeps the
   rendered `cpu: 1` limit (Guaranteed QoS), the same claim (the weights
   download once) and the gateway in front; pods run one at a time.
   The points are interleaved and repeated (benchmarks/verdict.py): a warm-up
   pod of the operator's (it downloads and first touches the weights; not
   counted), then every point once per round, A B C A B C ...; a point whose
   decode collapsed (cut at the cap) is not measured again. A point's
   spread is its per-round medians' lowest and highest; the verdict is the
   operator's median decode over the best median of the points whose thread
   count differs from the operator's: ">= 0.95", "inside the spread" (below
   0.95 but the two points' rounds overlap) or "below".
3. Each pod is measured through its gateway at the pod IP, after it is Ready
   (the gateway calibrated it first; its calibration is printed too):
   prefill from llama-server's own `timings` (a prompt of N words with a
   unique first word, `cache_prompt: false`, one token) and decode as tokens
   after the first over the time from the first to the last of a streamed
   completion (`ignore_eos`, greedy), capped in time; a capped decode's rate
   is an upper bound (`<`).

    python benchmarks/pods.py           # full: 120-word prompts, 64 tokens, 5 reps, 3 rounds
    python benchmarks/pods.py --quick   # CI: 16 words, 16 tokens, 2 reps, 2 rounds, caps of 5 s
    python benchmarks/pods.py --json    # the last line is one JSON object

Needs root, the real node's parts and the images of hack/build-images.sh (run
in this checkout: the gateway image is this source), and the model of
`hack/build-engines.sh model`. It starts its own real-node cluster and stops
it. The machine is shared: the load averages and the busiest other processes
are printed before and after.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from benchmarks.threads import (  # noqa: E402
    _without_threads,
    post_json,
    prompt,
    stream_tokens,
    threads_in,
)
from benchmarks.verdict import Measured, Spread, Verdict, interleaved, verdict  # noqa: E402
from localmodel.api import parse_local_model  # noqa: E402
from localmodel.desired import desired_state  # noqa: E402
from localmodel.engines import llama_server  # noqa: E402
from localmodel.facts import from_node  # noqa: E402
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT, SPEED_PATH  # noqa: E402
from localmodel.render import RenderOptions  # noqa: E402
from tests.harness import TestCluster, engines, locate_tools  # noqa: E402
from tests.harness.models import ModelFileServer  # noqa: E402
from tests.harness.processes import wait_for  # noqa: E402
from tests.harness.realnode import NODE_DIR, NODE_TOOLS  # noqa: E402
from tests.harness.tools import TOOL_NAMES  # noqa: E402
from tests.realnode.journey import local_volumes  # noqa: E402

NAMESPACE = "pods-bench"
NAME = "gemma-pods"
LABELS = {"app": "pods-bench"}  # not the operator's: no operator takes these for its own
VOLUMES_DIR = NODE_DIR / "pods-bench-volumes"  # removed with the node
VOLUME_INDEX = 90  # local PV numbers clear of the journey's
CPU = 1
CONTEXT = 1024
COMPLETIONS = "/v1/completions"  # the gateway's OpenAI-compatible route


@dataclass(frozen=True)
class Settings:
    prompt_words: int
    decode_tokens: int
    decode_cap: float
    reps: int
    request_timeout: float
    slow_seconds: float  # a prefill slower than this is not repeated
    calibrate: bool  # leave the gateway's calibration on (the pod is Ready after it)
    rounds: int  # every point once per round, interleaved (benchmarks/verdict.py)


FULL = Settings(120, 64, 30.0, 5, 300.0, 30.0, True, 3)
QUICK = Settings(16, 16, 5.0, 2, 120.0, 10.0, False, 2)


@dataclass
class Point:
    label: str
    threads: int | None  # -t/-tb; None: the engine's default
    ran_with: int | None = None  # the count the engine reported in its log
    ready_seconds: list[float] = field(default_factory=list)
    calibration: float | None = None
    prefill: list[float] = field(default_factory=list)  # one median per round
    decode: list[float] = field(default_factory=list)  # one median per round
    cut: bool = False

    @property
    def prefill_tps(self) -> float:
        return statistics.median(self.prefill) if self.prefill else 0.0

    @property
    def decode_tps(self) -> float:
        return statistics.median(self.decode) if self.decode else 0.0

    def measured(self) -> Measured:
        return Measured(self.label, self.ran_with or self.threads, tuple(self.decode), self.cut)


def busiest(n: int = 6) -> str:
    """The busiest processes now (what else ran), one line each."""
    out = subprocess.run(["ps", "-eo", "pcpu,etime,comm,args", "--sort=-pcpu"],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    return "\n".join("      " + line[:150] for line in out[1:n + 1])


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def local_model(url: str, sha256: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "bench"},
        "spec": {
            "model": "gemma3:270m", "engine": {"name": llama_server.NAME},
            "gguf": {"url": url, "sha256": sha256}, "cpu": CPU, "context": CONTEXT,
            "placement": {"nodeSelector": {"kubernetes.io/hostname": node}},
            "storage": {"storageClassName": "local-disk"},
        },
    }


def rendered(cluster: TestCluster, manifest: dict[str, Any],
             timeout: float = 120.0) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The operator's objects for the model on the real node: (claims, pod, the
    decisions' one-line story). The node is read again until the planner places
    the model on it (a node that has just come up may still carry a taint or
    lack the allocatable the model asks for), for up to `timeout` seconds;
    then the planner's reason ends the run."""
    assert cluster.real_node is not None
    lm = parse_local_model(manifest)
    options = RenderOptions(operator_image=cluster.real_node.images.operator,
                            # the harness's model server: plain http
                            allow_http_downloads=True)
    said: list[str] = []

    def placed() -> Any:
        assert cluster.real_node is not None
        node = cluster.api().get(f"/api/v1/nodes/{cluster.real_node.name}")
        result = desired_state([lm], [from_node(node)], now="2026-12-01T00:00:00Z",
                               options=options).models[0]
        if result.replicas and not result.unplaced and not result.problems:
            return result
        why = "; ".join([str(p) for p in result.problems]
                        + [f"{u.reason}: {u.message}" for u in result.unplaced]) or "no replica"
        if not said or said[-1] != why:
            print(f"   not placed on {node['metadata']['name']} yet: {why}", flush=True)
            said.append(why)
        return None

    try:
        result = wait_for("the model placed on the real node", placed, timeout, interval=2.0)
    except AssertionError as e:
        raise SystemExit(f"pods.py: the planner did not place the model on the real node "
                         f"within {timeout:.0f} s: {said[-1] if said else e}") from e
    objects = [copy.deepcopy(o) for o in result.objects]
    for o in objects:  # no LocalModel object exists: nothing owns them
        o["metadata"].pop("ownerReferences", None)
        o["metadata"]["labels"] = dict(LABELS)
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    [pod] = [o for o in objects if o["kind"] == "Pod"]
    story = [f"{d.rule}: {d.effect}" for r in result.replicas for d in r.tuning.decisions]
    return claims, pod, story


def engine_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == llama_server.NAME)


def rendered_threads(pod: dict[str, Any]) -> int:
    args = engine_container(pod).get("args") or []
    return int(args[args.index("-t") + 1])


def variant(pod: dict[str, Any], point: Point, s: Settings, index: int) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["name"] = f"{NAME}-p{index}"
    out["metadata"]["labels"] = dict(LABELS)
    engine = engine_container(out)
    args = list(_without_threads(list(engine.get("args") or [])))
    if point.threads is not None:
        args += ["-t", str(point.threads), "-tb", str(point.threads)]
    engine["args"] = args
    if not s.calibrate:
        for c in out["spec"]["containers"] + out["spec"].get("initContainers", []):
            if any(e["name"].startswith("LOCALMODEL_GATEWAY_") for e in c.get("env") or []):
                c["env"] = [*c["env"], {"name": "LOCALMODEL_GATEWAY_CALIBRATE_TOKENS",
                                        "value": "0"}]
    return out


def pod_ready(api: Any, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "Ready" and c["status"] == "True":
            return pod
    return None


def measure(ip: str, point: Point, s: Settings, tag: int) -> None:
    """One round of `point` in its Ready pod at `ip`: the medians of its
    requests appended to the point's per-round samples."""
    base = f"http://{ip}:{GATEWAY_PORT}"
    with urllib.request.urlopen(f"http://{ip}:{ADMIN_PORT}{SPEED_PATH}", timeout=10) as resp:
        calibration = json.loads(resp.read()).get("calibration") or {}
    point.calibration = calibration.get("decode_tokens_per_second") or point.calibration
    post_json(base + COMPLETIONS, {"prompt": prompt(8, tag), "max_tokens": 1,
                                   "cache_prompt": False}, s.request_timeout)  # warm-up
    prefill: list[float] = []
    decode: list[float] = []
    for i in range(s.reps):
        began = time.monotonic()
        doc = post_json(base + COMPLETIONS, {"prompt": prompt(s.prompt_words, tag + i + 1),
                                             "max_tokens": 1, "cache_prompt": False},
                        s.request_timeout)
        t = doc["timings"]
        prefill.append(float(t["prompt_n"]) / (float(t["prompt_ms"]) / 1000))
        if time.monotonic() - began > s.slow_seconds:
            break
    point.prefill.append(statistics.median(prefill))
    try:
        measure_decode(ip, point, s, tag, decode)
    finally:
        if decode:
            point.decode.append(statistics.median(decode))


def measure_decode(ip: str, point: Point, s: Settings, tag: int, decode: list[float]) -> None:
    for i in range(s.reps):
        body = {"prompt": f"w{tag + 50 + i} Once upon a time", "max_tokens": s.decode_tokens,
                "stream": True, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
        d = stream_tokens(GATEWAY_PORT, COMPLETIONS, body,
                          lambda line: b'"finish_reason":null' in line.replace(b" ", b""),
                          lambda line: b"[DONE]" in line, s.decode_cap, s.request_timeout,
                          host=ip)
        decode.append(d.rate)
        if d.cut:
            point.cut = True
            break


def run_point(cluster: TestCluster, pod: dict[str, Any], point: Point, s: Settings,
              index: int) -> None:
    api = cluster.api()
    body = variant(pod, point, s, index)
    name = body["metadata"]["name"]
    began = time.monotonic()
    api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    try:
        ready = wait_for(f"pod {name} Ready", lambda: pod_ready(api, name), 600, interval=0.25)
        point.ready_seconds.append(time.monotonic() - began)
        log = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log"
                          f"?container={llama_server.NAME}")[1].get("message", "")
        point.ran_with = threads_in(str(log).encode()) or point.ran_with
        measure(ready["status"]["podIP"], point, s, 1000 * index)
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
        wait_for(f"pod {name} gone", lambda: api.status_of(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") == 404, 120, interval=0.5)
        print(f"   ... {point.label}: {time.monotonic() - began:.0f} s, load {loadavg()}",
              file=sys.stderr, flush=True)


def fmt(value: float | None, prefix: str = "") -> str:
    if value is None or value <= 0:
        return "n/a"
    if value >= 100:
        return f"{prefix}{value:.0f}"
    return f"{prefix}{value:.2f}" if value < 10 else f"{prefix}{value:.1f}"


def ratio(a: float, b: float) -> float | None:
    return a / b if a > 0 and b > 0 else None


def run_points(cluster: TestCluster, models: ModelFileServer, s: Settings) -> dict[str, Any]:
    """Every point, one pod at a time, on `cluster`'s real node (its model files
    served by `models`); the report's numbers."""
    assert cluster.real_node is not None
    began = time.monotonic()
    gguf = engines.require("model")
    node = cluster.real_node.name
    api = cluster.api()
    cluster.apply(local_volumes(node, 1, VOLUMES_DIR, VOLUME_INDEX))
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    try:
        wait_for("the default ServiceAccount", lambda: api.status_of(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default") == 200, 60)
        sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
        claims, pod, story = rendered(cluster, local_model(models.url_of(gguf.name), sha, node))
        for claim in claims:
            api.create(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", claim)
        chosen = rendered_threads(pod)
        print(f"   node {node}; the rules: " + "; ".join(story))
        print(f"   load average before {loadavg()}; busiest processes:\n{busiest()}")
        points = [Point("operator (rules)", chosen), Point("engine default", None),
                  Point("8 threads", 8)]
        # The operator's own count is the operator's point: the same command.
        points += [Point(f"sweep {n}", n) for n in range(1, 2 * CPU + 1) if n != chosen]
        warmup = Point("warm-up (operator's)", chosen)
        for index, (round_, point) in enumerate(interleaved(points, s.rounds, warmup)):
            if round_ > 1 and point.cut:
                continue  # collapsed: measuring it again only costs the machine's others
            print(f"   ... round {round_}: {point.label}", file=sys.stderr, flush=True)
            run_point(cluster, pod, point, s, index)
        print(f"   load average after {loadavg()}; busiest processes:\n{busiest()}")
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
    return report(points, chosen, time.monotonic() - began)


def run(s: Settings, quick: bool) -> dict[str, Any]:
    """A real-node cluster of its own, the points, and the cluster stopped."""
    gguf = engines.require("model")
    tools = locate_tools(TOOL_NAMES + NODE_TOOLS)
    cluster = TestCluster(tools=tools, real_node=True)
    print(f"pods.py: {'quick' if quick else 'full'}: prompt {s.prompt_words} words, decode "
          f"{s.decode_tokens} tokens capped at {s.decode_cap:g} s, {s.reps} reps (median) "
          f"in each of {s.rounds} interleaved rounds after a warm-up pod; "
          f"gateway calibration {'on' if s.calibrate else 'off'}")
    began = time.monotonic()
    cluster.start(timeout=300)
    models = ModelFileServer(gguf.parent, bind=cluster.node_address)
    try:
        models.start()
        print(f"   cluster with the real node up in {time.monotonic() - began:.0f} s")
        return run_points(cluster, models, s)
    finally:
        models.stop()
        cluster.stop()


def report(points: list[Point], chosen: int, seconds: float) -> dict[str, Any]:
    op = points[0]
    print(f"   {'point':<20} {'threads':>8} {'Ready s':>8} {'calib tok/s':>12} "
          f"{'prefill tok/s':>14} {'op/pt prefill':>14} {'op/pt decode':>13}  "
          f"decode tok/s: median [lowest-highest of the rounds]")
    for p in points:
        bound = "<" if p.cut else ""
        ran = p.ran_with or p.threads
        decode = Spread.of(p.decode).text("{:.2f}") if p.decode else "n/a"
        print(f"   {p.label:<20} {ran if ran else 'default':>8} "
              f"{statistics.median(p.ready_seconds) if p.ready_seconds else 0:>8.1f} "
              f"{fmt(p.calibration):>12} {fmt(p.prefill_tps):>14} "
              f"{fmt(ratio(op.prefill_tps, p.prefill_tps)):>14} "
              f"{fmt(ratio(op.decode_tps, p.decode_tps), '>' if p.cut else ''):>13}  "
              f"{bound}{decode}" + ("   decode cut at the cap: upper bound" if p.cut else ""))
    judged: Verdict = verdict(op.measured(), [p.measured() for p in points[1:]])
    eight = next(p for p in points if p.threads == 8)
    vs_eight = ratio(op.decode_tps, eight.decode_tps)
    default = next(p for p in points if p.threads is None)
    print(f"   {judged.text()}")
    print(f"   operator ({chosen} thread{'s' * (chosen != 1)}) / engine default decode "
          f"{fmt(ratio(op.decode_tps, default.decode_tps))}; operator / 8 threads decode "
          f"{fmt(vs_eight, '>' if eight.cut else '')} (prefill "
          f"{fmt(ratio(op.prefill_tps, eight.prefill_tps))}); {seconds:.0f} s in all")
    return {
        "cpu": CPU, "operator_threads": chosen,
        "verdict": judged.kind, "operator_vs_best_decode": judged.ratio, "best": judged.best,
        "operator_vs_default_decode": ratio(op.decode_tps, default.decode_tps),
        "operator_vs_8_decode": vs_eight, "eight_is_lower_bound": eight.cut,
        "operator_vs_8_prefill": ratio(op.prefill_tps, eight.prefill_tps),
        "points": [{"label": p.label, "threads": p.threads, "ran_with": p.ran_with,
                    "ready_s": [round(r, 1) for r in p.ready_seconds],
                    "calibration_decode": p.calibration, "prefill": p.prefill_tps,
                    "decode": p.decode_tps, "decode_rounds": p.decode,
                    "prefill_rounds": p.prefill, "cut": p.cut} for p in points],
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: short prompts and caps")
    parser.add_argument("--json", action="store_true", help="one JSON object as the last line")
    args = parser.parse_args()
    out = run(QUICK if args.quick else FULL, args.quick)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
