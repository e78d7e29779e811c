"""Idle models on the real node (docs/idle.md, issue 44): a llama-server model
with `idle: {after: 1m, release: WhenAsleep}` falls asleep after a minute
without a request (Ready=True reason Asleep, its pod gone, its claim kept); a
request through the router wakes it and the official `openai` client is
answered, each step of the wake printed as a `[timing]` line in the timeline's
order beside the engine's own load time of the same weights (llama-server's
own log lines in the woken pod, and a llama-server started on this host); the
weights are not downloaded again (the model file server's counts).

Then a second idle model takes the node while the first sleeps (each model
holds its node: `placement.exclusive`, the default; there is one real node), a
request for the first waits at the router (Waking, WaitingForNode) while the
second streams, and is answered only after the second's stream completed and
it yielded: a busy model is never evicted. kstatus (and Argo CD's check) read
the sleeping model Current throughout (`lmhealth`, as tests/gitops does).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import openai
import pytest

from localmodel.engines import llama_server
from tests.harness.chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.chart import RELEASE
from tests.harness.engines import MODEL_TAG
from tests.harness.engines import llama_server as host_llama_server
from tests.harness.fixtures import tools_or_fail
from tests.harness.processes import wait_for
from tests.harness.tools import REPO_ROOT
from tests.realnode.conftest import VOLUMES, VOLUMES_DIR
from tests.realnode.journey import (
    LONG_PROMPT,
    MODEL_NAMESPACE,
    PODS_PATH,
    PROMPT,
    Journey,
    Manifest,
    clean_reply,
    condition,
    local_volumes,
    replica_pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

SLEEPER = "gemma-sleepy"
TAKER = "gemma-taker"
TAKER_TAG = "gemma3-taker:270m"  # the taker's served name: the router routes by it
# holdSeconds: the sleeper's held request waits out the taker's stream and grace.
IDLE = {"after": "1m", "release": "WhenAsleep", "holdSeconds": 540}
SLEEP_WITHIN = 300.0  # s: the minute, the operator's reads (every 15 s), the close, the delete
ANSWER_WITHIN = 600.0  # s: the official client's patience for a held request
TAKER_TOKENS = 400
ROUTER_SERVICE, ROUTER_PORT = f"{RELEASE}-router", 80
LUA = REPO_ROOT / "docs" / "gitops" / "localmodel-health.lua"


def reason(obj: Manifest, kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("reason", ""))
    return ""


def idle_of(obj: Manifest) -> Manifest:
    idle: Manifest = (obj.get("status") or {}).get("idle") or {}
    return idle


@dataclass
class Watch:
    """A model sampled every 0.25 s from `t0` on, in a thread: when each step of
    a wake was first seen (seconds after `t0`), and every version of the
    LocalModel (for kstatus)."""

    journey: Journey
    name: str
    t0: float = field(default_factory=time.monotonic)
    seen: dict[str, float] = field(default_factory=dict)
    versions: dict[str, Manifest] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def mark(self, what: str) -> None:
        self.seen.setdefault(what, time.monotonic() - self.t0)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self._look()
            except Exception as exc:  # an API hiccup costs one sample, never the watch
                print(f"watch {self.name}: {exc}")
            time.sleep(0.25)

    def _look(self) -> None:
        lm = self.journey.model(self.name)
        self.versions.setdefault(lm["metadata"]["resourceVersion"], lm)
        ready, awake = reason(lm, "Ready"), reason(lm, "Awake")
        if ready == "Waking":
            self.mark("operator: Waking (it read the router's /waiting)")
        if awake == "WaitingForNode":
            self.mark("operator: WaitingForNode")
        pods = self.journey.pods_of(self.name)
        if pods:
            self._look_at_pod(pods[0])
        if self.seen and condition(lm, "Ready") == "True" and ready not in ("Asleep", "Waking"):
            self.mark("LocalModel Ready (awake)")

    def _look_at_pod(self, pod: Manifest) -> None:
        self.mark("pod created")
        if pod["spec"].get("nodeName"):
            self.mark("pod scheduled")
        status = pod.get("status") or {}
        inits = status.get("initContainerStatuses") or []
        if inits and all((s.get("state") or {}).get("terminated") for s in inits):
            self.mark("download step done")
        engines = {s["name"]: s for s in status.get("containerStatuses") or []}
        engine = engines.get(llama_server.NAME) or {}
        if (engine.get("state") or {}).get("running"):
            self.mark("engine container started")
        if engine.get("started"):
            self.mark("engine loaded (its startup probe passed)")
        if engines and all(s.get("ready") for s in engines.values()):
            self.mark("pod Ready")

    def print_timeline(self, journey: Journey, label: str) -> None:
        for what, at in sorted(self.seen.items(), key=lambda kv: kv[1]):
            journey.timings.add(f"{label}: request sent -> {what}", at)


def kstatus_verdicts(versions: list[Manifest]) -> list[dict[str, Any]]:
    """kstatus's and Argo CD's verdicts on each version (`lmhealth`, tests/gitops)."""
    tools = tools_or_fail(("lmhealth",))
    out = subprocess.run([str(tools["lmhealth"]), "-lua", str(LUA)],
                         input="\n".join(json.dumps(v) for v in versions),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def assert_current(versions: list[Manifest]) -> None:
    verdicts = kstatus_verdicts(versions)
    assert len(verdicts) == len(versions)
    bad = [(v["kstatus"], v.get("lua")) for v in verdicts if v["kstatus"]["status"] != "Current"]
    assert not bad, bad
    print(f"kstatus: {len(verdicts)} versions of the sleeping model, every one Current")


def all_pods(journey: Journey, name: str) -> list[Manifest]:
    """The model's replica pods, terminating ones too (not its doorman)."""
    items: list[Manifest] = journey.get(f"{PODS_PATH}?labelSelector={replica_pods(name)}")["items"]
    return items


def asleep_and_released(journey: Journey, name: str) -> Manifest | None:
    lm = journey.model(name)
    idle = idle_of(lm)
    done = (condition(lm, "Ready") == "True" and reason(lm, "Ready") == "Asleep"
            and idle.get("state") == "Asleep" and idle.get("resident") is False
            and not all_pods(journey, name))
    return lm if done else None


def wait_asleep(journey: Journey, name: str) -> Manifest:
    """The model falls asleep and gives its node back; its claims kept, Bound."""
    began = time.monotonic()
    lm: Manifest = wait_for(f"{name} asleep, its pod gone", lambda: asleep_and_released(
        journey, name), SLEEP_WITHIN, interval=1)
    journey.timings.add(f"{name}: waited for it to fall asleep and release its node",
                        time.monotonic() - began)
    homes = idle_of(lm).get("homes") or []
    assert homes, lm["status"]
    for home in homes:
        claim = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}/persistentvolumeclaims/"
                            f"{home['claim']}")
        assert claim["status"]["phase"] == "Bound", claim["status"]
        assert home["node"] == journey.node, home
    return lm


@pytest.fixture(scope="module")
def router(journey: Journey) -> Iterator[str]:
    """The chart's router on (as test_router_on_node.py turns it on), two local
    volumes of this module's own, and a port-forward to the router's Service."""
    journey.cluster.apply(local_volumes(journey.node, 2, VOLUMES_DIR, first=VOLUMES + 30))
    seconds = journey.upgrade_chart(*journey.router_settings())
    journey.timings.add("helm upgrade: router on", seconds)
    try:
        with journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url:
            yield url
    finally:
        for name in (TAKER, SLEEPER):
            if journey.cluster.api().status_of("GET", f"/apis/localmodel.dev/v1alpha1/"
                                               f"namespaces/{MODEL_NAMESPACE}/localmodels/"
                                               f"{name}") == 200:
                journey.delete_model(name)
        journey.upgrade_chart("--set", "router.enabled=false")


def idle_model(journey: Journey, name: str) -> Manifest:
    manifest = journey.local_model(name, llama_server.NAME)
    manifest["spec"]["idle"] = dict(IDLE)
    return manifest


def taker_model(journey: Journey) -> Manifest:
    """The second model: the same GGUF under its own served name (so the catalog
    does not know it: its size and shape given, gemma3:270m's)."""
    manifest = idle_model(journey, TAKER)
    manifest["spec"]["model"] = TAKER_TAG
    manifest["spec"]["modelInfo"] = {"weightsSize": "292M", "layers": 18, "kvHeads": 1,
                                     "keyLength": 256, "valueLength": 256, "family": "gemma3"}
    return manifest


def listed(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30, max_retries=0)
    return [m.id for m in client.models.list().data]


def stream_chat(url: str, model: str, max_tokens: int, prompt: str, t0: float,
                timeout: float = ANSWER_WITHIN) -> tuple[str, str | None, float, float]:
    """A streamed chat by the official client: (text, finish reason, first token
    and end in seconds after `t0`)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=timeout,
                           max_retries=0)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True)
    text, finish, first = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content and first is None:
                first = time.monotonic() - t0
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert first is not None, "no token came"
    return text, finish, first, time.monotonic() - t0


def engine_log_load_seconds(journey: Journey, pod: str) -> float:
    """llama-server's own time from its first log line to `model loaded`, from
    the kubelet's timestamps of its log lines."""
    log = journey.kubectl("logs", "-n", MODEL_NAMESPACE, pod, "-c", llama_server.NAME,
                          "--timestamps")
    lines = [line.split(" ", 1) for line in log.splitlines() if " " in line]
    stamps = [(datetime.fromisoformat(ts.replace("Z", "+00:00")), text) for ts, text in lines]
    loaded = [at for at, text in stamps if "model loaded" in text]
    assert stamps and loaded, log[-3000:]
    return (loaded[0] - stamps[0][0]).total_seconds()


def host_engine_load_seconds(journey: Journey) -> float:
    """A llama-server started on this host on the same GGUF (one thread, the
    pod's context), warm page cache: start -> healthy, the second of two starts."""
    seconds = 0.0
    for _ in range(2):
        began = time.monotonic()
        with host_llama_server(journey.cluster.workdir / "idle-engine",
                               ["-t", "1", "-c", "1024"]):
            seconds = time.monotonic() - began
    return seconds


def print_events(journey: Journey, name: str) -> None:
    """The model's idle Events (Asleep, Waking, Woke, WaitingForNode, Yielded...), oldest first."""
    events = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}/events?fieldSelector="
                         f"involvedObject.name%3D{name}")["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    for e in events:
        print(f"  event {name}: {e.get('lastTimestamp') or e.get('eventTime')} "
              f"{e.get('reason')}: {e.get('message', '')}")


def test_an_idle_model_sleeps_a_request_wakes_it_and_a_busy_one_is_never_evicted(
    journey: Journey, router: str
) -> None:
    url = router
    with Watch(journey, SLEEPER) as whole:
        deployed = journey.deploy(idle_model(journey, SLEEPER))
        assert deployed.downloads == 1, deployed.downloads
        wait_for("the router to list the model", lambda: MODEL_TAG in listed(url), 60,
                 interval=0.5)
        journey.openai_chat(url, f"{SLEEPER}: answered through the router, awake")
        asleep_from = len(whole.versions)
        wait_asleep(journey, SLEEPER)
        downloads = journey.downloads()
        host = journey.timings.add("llama-server on this host, same GGUF, warm cache: "
                                   "start -> healthy", host_engine_load_seconds(journey))
        wake = wake_through_router(journey, url)
        journey.timings.add(f"{SLEEPER}: llama-server's own log: first line -> model loaded",
                            engine_log_load_seconds(journey, journey.pod_of(SLEEPER)
                                                    ["metadata"]["name"]))
        print(f"wake {wake:.1f} s = {wake / host:.1f} x the host engine's load ({host:.1f} s)")
        assert journey.downloads() == downloads, "the wake downloaded the weights again"
        wait_asleep(journey, SLEEPER)
        busy_one_is_never_evicted(journey, url)
        assert journey.downloads() == downloads + 1, "only the taker's own claim downloads"
        versions = list(whole.versions.values())[asleep_from:]
    assert_current([v for v in versions if idle_of(v).get("state") in ("Asleep", "Waking")])


def wake_through_router(journey: Journey, url: str) -> float:
    """A request through the router wakes the sleeper; each step printed in the
    timeline's order. The seconds from the request to its first token."""
    with Watch(journey, SLEEPER) as watch:
        text, _, first, done = stream_chat(url, MODEL_TAG, 16, PROMPT, watch.t0)
        watch.seen["first token"] = first
        watch.seen["answered"] = done
    clean_reply(text)
    watch.print_timeline(journey, f"{SLEEPER} woken")
    print_events(journey, SLEEPER)
    # The pod's own steps come in this order; the operator's Waking is written
    # in the pass that creates the pod (seen before or beside it).
    assert "operator: Waking (it read the router's /waiting)" in watch.seen, watch.seen
    order = ["pod created", "pod scheduled", "engine container started",
             "engine loaded (its startup probe passed)", "pod Ready"]
    missing = [w for w in order if w not in watch.seen]
    assert not missing, (missing, watch.seen)
    at = [watch.seen[w] for w in order]
    assert at == sorted(at), list(zip(order, at, strict=True))
    # The first token is the client's clock; the samples lag by up to one look
    # (0.25 s and an API call), so it is only known to follow the engine's start.
    assert first > watch.seen["engine container started"], watch.seen
    # The router answers once the replica is Ready; the operator writes Awake in
    # its next pass after that, which may come after the answer: wait for it.
    def awake() -> Manifest | None:
        lm = journey.model(SLEEPER)
        idle = idle_of(lm)
        return lm if idle.get("state") == "Awake" and idle.get("wakes", 0) >= 1 else None
    lm = wait_for(f"{SLEEPER} Awake in status.idle after its wake", awake, 60, interval=0.5)
    print(f"{SLEEPER}: status.idle.lastWake {idle_of(lm).get('lastWake')}")
    return first


def busy_one_is_never_evicted(journey: Journey, url: str) -> None:
    """The taker takes the node while the sleeper sleeps; a request for the
    sleeper waits while the taker streams and is answered after the taker's
    stream completed and it yielded."""
    taker = journey.deploy(taker_model(journey))
    assert taker.downloads == 1, taker.downloads
    assert not all_pods(journey, SLEEPER)
    wait_for("the router to list the taker", lambda: TAKER_TAG in listed(url), 60, interval=0.5)
    held: dict[str, Any] = {}
    with Watch(journey, SLEEPER) as watch:
        def ask_for_the_sleeper() -> None:
            try:
                held["reply"] = stream_chat(url, MODEL_TAG, 16, PROMPT, watch.t0)
            except Exception as exc:  # the assertion below names it
                held["error"] = exc

        asker = threading.Thread(target=ask_for_the_sleeper, daemon=True)
        started = threading.Event()
        taken = taker_stream(url, watch, asker, started)
        asker.join(ANSWER_WITHIN)
    assert "reply" in held, held
    text, finish, began, done = taken
    print(f"{TAKER}: streamed {len(text)} characters ({finish}), "
          f"from {began:.1f} s to {done:.1f} s; "
          f"{SLEEPER}'s held request answered at {held['reply'][2]:.1f} s")
    assert finish == "length", (finish, text[-200:])
    assert held["reply"][2] > done, "the sleeper was answered before the taker's stream ended"
    assert "operator: Waking (it read the router's /waiting)" in watch.seen, watch.seen
    assert "operator: WaitingForNode" in watch.seen, watch.seen
    clean_reply(held["reply"][0])
    watch.print_timeline(journey, f"{SLEEPER} woken past the taker")
    print_events(journey, TAKER)
    print_events(journey, SLEEPER)
    taker_lm = journey.model(TAKER)
    assert idle_of(taker_lm).get("yields", 0) >= 1, taker_lm["status"]
    assert not journey.pods_of(TAKER)


def taker_stream(url: str, watch: Watch, asker: threading.Thread,
                 started: threading.Event) -> tuple[str, str | None, float, float]:
    """The taker's long stream; once it is under way, the sleeper is asked for."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=ANSWER_WITHIN,
                           max_retries=0)
    stream = client.chat.completions.create(
        model=TAKER_TAG, messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=TAKER_TOKENS, temperature=0, stream=True)
    text, finish, first = "", None, 0.0
    for chunks, chunk in enumerate(stream, 1):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        if chunks == 5:
            first = time.monotonic() - watch.t0
            asker.start()
            started.set()
    assert started.is_set(), f"the taker's stream ended within 5 chunks: {text!r}"
    return text, finish, first, time.monotonic() - watch.t0
