"""Issue 44's journeys on the kwok control plane (docs/idle.md): the real
operator (`localmodel run --router-namespace`, the chart's RBAC with the
router on), the real router in this process (its cluster source, its hold),
kwok nodes, and stand-in gateways at the kwok pods' IPs (kwok runs no
container: tests/harness/idle_standins.py) whose quiet or busy state the test sets.

Each test makes its own nodes (labelled with its namespace, which its models
select), so the tests share one cluster, one operator and one router. Every
wait is on a condition with a generous bound (2 shared cores); no timed
assertion. The operator runs with a short yield grace and frequent speed
reads (OPERATOR_ARGS); the stand-ins' clocks are moved on instead of waiting
for quiet.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.idle_standins import (
    JOURNEY,
    Gateways,
    IdlePlane,
    Router,
    Standin,
    add_nodes,
    idle_plane,
    router_args,
)
from tests.harness.operator import OperatorProcess, wait_condition
from tests.harness.processes import wait_until
from tests.harness.tools import REPO_ROOT

pytestmark = pytest.mark.e2e

LM = "/apis/localmodel.dev/v1alpha1"
GRACE_S = 5  # the operator's --yield-grace here (its default is 30 s)
SERVED = "qwen3:0.6b"
WAIT = 240.0  # a sleep, a release or a wake on a loaded machine: generous


# The operator's clocks made short where a journey waits on them: the yield
# grace (a quiet borrower is asked once quiet this long; a refused ask is
# repeated after it), the speed reads that carry a gateway's activity, and
# how long an Unschedulable pod waits before WaitingForNode.
OPERATOR_ARGS = router_args("--unschedulable-seconds", "5", "--speed-interval", "1",
                            "--speed-idle-interval", "2", "--yield-grace", str(GRACE_S))


@pytest.fixture(scope="module")
def plane() -> Iterator[IdlePlane]:
    with idle_plane(OPERATOR_ARGS) as running:
        yield running


@pytest.fixture(scope="module")
def cluster(plane: IdlePlane) -> TestCluster:
    return plane.cluster


@pytest.fixture(scope="module")
def operator(plane: IdlePlane) -> OperatorProcess:
    return plane.operator


@pytest.fixture(scope="module")
def gateways(plane: IdlePlane) -> Gateways:
    return plane.gateways


@pytest.fixture(scope="module")
def router(plane: IdlePlane) -> Router:
    return plane.router


@pytest.fixture
def ns(cluster: TestCluster, gateways: Gateways) -> Iterator[str]:
    with cluster.fresh_namespace("idle") as name:
        gateways.namespaces.add(name)
        yield name
        for node in cluster.api().get(f"/api/v1/nodes?labelSelector={JOURNEY}={name}")["items"]:
            cluster.api().request("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")


# ---- helpers ---------------------------------------------------------------------


def model(ns: str, name: str, served: str = SERVED, **idle: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": served, "cpu": 3, "context": 4096,
                            "storage": {"retain": False, "size": "5Gi"},
                            "placement": {"nodeSelector": {JOURNEY: ns}}}
    if idle:
        spec["idle"] = idle
    return MakeLocalModel(name, ns).spec(**spec).manifest()


def apply(cluster: TestCluster, *objs: dict[str, Any], server_side: bool = False) -> None:
    extra = ("--server-side", "--field-manager", "gitops") if server_side else ()
    cluster.kubectl("apply", *extra, "-f", "-", stdin=yaml.safe_dump_all(list(objs)))


def get_lm(cluster: TestCluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.api().get(f"{LM}/namespaces/{ns}/localmodels/{name}")


def pods_of(cluster: TestCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = cluster.api().get(
        f"/api/v1/namespaces/{ns}/pods?labelSelector=localmodel.dev/name={name}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")
            and (p["metadata"].get("labels") or {}).get("localmodel.dev/role") != "doorman"]


def claims_of(cluster: TestCluster, ns: str) -> dict[str, str]:
    """Each claim's name and the node its volume is pinned to."""
    items = cluster.api().get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims")["items"]
    out = {}
    for c in items:
        volume = (c.get("spec") or {}).get("volumeName")
        node = ""
        if volume:
            pv = cluster.api().get(f"/api/v1/persistentvolumes/{volume}")
            node = pv["metadata"]["labels"].get("localmodel.dev/test-node", "")
        out[c["metadata"]["name"]] = node
    return out


def idle_of(cluster: TestCluster, ns: str, name: str) -> dict[str, Any]:
    return (get_lm(cluster, ns, name).get("status") or {}).get("idle") or {}


def condition(lm: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (lm.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


def awake_on(cluster: TestCluster, gateways: Gateways, ns: str, name: str) -> tuple[str, Standin]:
    """Wait until the model is Ready with one pod and its stand-in answers;
    the pod's node and the stand-in."""
    wait_condition(cluster, ns, name, "Ready", timeout=WAIT)
    wait_until(f"{ns}/{name}'s stand-in gateway", lambda: len(pods_of(cluster, ns, name)) == 1
               and len(gateways.of(ns, name)) == 1, timeout=WAIT)
    [pod] = pods_of(cluster, ns, name)
    [standin] = gateways.of(ns, name)
    return pod["spec"]["nodeName"], standin


def released(cluster: TestCluster, ns: str, name: str) -> bool:
    st = idle_of(cluster, ns, name)
    return st.get("state") == "Asleep" and st.get("resident") is False and not pods_of(
        cluster, ns, name)


def wait_released(cluster: TestCluster, operator: OperatorProcess, ns: str, name: str) -> None:
    try:
        wait_until(f"{ns}/{name} asleep and released", lambda: released(cluster, ns, name),
                   timeout=WAIT)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{yaml.safe_dump(get_lm(cluster, ns, name).get('status'))}"
                             f"\n{operator.log_tail(60)}") from exc


def filler(cluster: TestCluster, ns: str, node: str) -> None:
    """A pod that is no model's, taking 3 of a node's 4 CPUs."""
    cluster.api().create(f"/api/v1/namespaces/{ns}/pods", {
        "metadata": {"name": f"filler-{node[-1]}"},
        "spec": {"nodeName": node, "containers": [{
            "name": "busy", "image": "registry.invalid/busy:1",
            "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]}})


POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="caller")


def ask(router: Router, ns: str, served: str = SERVED, stream: bool = False,
        timeout_s: float = 600) -> Future[tuple[int, str]]:
    """A chat completion through the router, in the background: its status and body."""
    body = json.dumps({"model": f"{ns}/{served}", "stream": stream,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    request = urllib.request.Request(router.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})

    def call() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    return POOL.submit(call)


class Seen:
    """Every `status.idle.wake` and `Awake` reason a model showed, read in a
    thread of its own until `stop` (a wake's cost is gone once it is awake)."""

    def __init__(self, cluster: TestCluster, ns: str, name: str) -> None:
        self.cluster, self.ns, self.name = cluster, ns, name
        self.wakes: list[dict[str, Any]] = []
        self.reasons: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.wait(0.2):
            try:
                lm = get_lm(self.cluster, self.ns, self.name)
            except Exception:  # the API server's hiccup: read again
                continue
            wake = ((lm.get("status") or {}).get("idle") or {}).get("wake")
            if wake and wake not in self.wakes:
                self.wakes.append(wake)
            reason = condition(lm, "Awake").get("reason", "")
            if reason and reason not in self.reasons:
                self.reasons.append(reason)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def passes(operator: OperatorProcess) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in operator.metrics().splitlines()
               if line.startswith("localmodel_operator_passes_total"))


def kstatus(cluster: TestCluster, ns: str, name: str) -> dict[str, Any]:
    assert cluster.tools is not None
    text = json.dumps(get_lm(cluster, ns, name))
    lua = REPO_ROOT / "docs" / "gitops" / "localmodel-health.lua"
    out = subprocess.run([str(cluster.tools["lmhealth"]), "-lua", str(lua)], input=text,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    verdict: dict[str, Any] = json.loads(out.stdout.splitlines()[0])["kstatus"]
    return verdict


# ---- the journeys ----------------------------------------------------------------


def test_an_idle_model_is_released_and_a_held_request_wakes_it_on_its_home_node(
    cluster: TestCluster, operator: OperatorProcess, gateways: Gateways, router: Router,
    ns: str
) -> None:
    add_nodes(cluster, ns, "a", "b")
    manifest = model(ns, "sleeper", after="1m", release="WhenAsleep", holdSeconds=600)
    apply(cluster, manifest)
    home, standin = awake_on(cluster, gateways, ns, "sleeper")
    claims = claims_of(cluster, ns)
    assert list(claims.values()) == [home], claims

    standin.idle_for(120)  # its gateway has been quiet for two minutes
    wait_released(cluster, operator, ns, "sleeper")
    lm = get_lm(cluster, ns, "sleeper")
    ready = condition(lm, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Asleep"), ready
    assert lm["status"].get("replicas", 0) == 0
    assert [h["node"] for h in lm["status"]["idle"]["homes"]] == [home]
    assert claims_of(cluster, ns) == claims  # the claim and its node kept
    assert kstatus(cluster, ns, "sleeper")["status"] == "Current"
    assert standin.closes >= 1 and standin.busy_closes == 0
    assert gateways.busy_evictions == 0

    # A GitOps apply of the same manifest during sleep changes nothing.
    generation = lm["metadata"]["generation"]
    before = passes(operator)
    apply(cluster, manifest, server_side=True)
    wait_until("two passes after the apply", lambda: passes(operator) >= before + 2,
               timeout=WAIT)
    lm = get_lm(cluster, ns, "sleeper")
    assert lm["metadata"]["generation"] == generation
    assert lm["status"]["observedGeneration"] == generation
    assert released(cluster, ns, "sleeper")
    assert lm["status"]["idle"].get("wakes", 0) == 0

    # A request held at the router wakes it, on its home node, and is relayed.
    answer = ask(router, ns)
    answer_status, body = answer.result(timeout=WAIT + 60)
    assert answer_status == 200, body
    [pod] = pods_of(cluster, ns, "sleeper")
    assert pod["spec"]["nodeName"] == home
    assert f"{pod['metadata']['name']} here" in body
    assert claims_of(cluster, ns) == claims  # the same claim: nothing downloads again
    wait_until("the wake recorded", lambda: idle_of(cluster, ns, "sleeper").get("wakes") == 1,
               timeout=WAIT)
    st = idle_of(cluster, ns, "sleeper")
    assert st["state"] == "Awake" and st["lastWake"]["node"] == home, st
    assert st["lastWake"]["warmCache"] is True, st
    assert gateways.busy_evictions == 0


def test_a_sleeper_whose_home_is_taken_wakes_elsewhere_at_a_cost_or_waits_for_a_node(
    cluster: TestCluster, operator: OperatorProcess, gateways: Gateways, router: Router,
    ns: str
) -> None:
    a, b = add_nodes(cluster, ns, "a", "b")
    apply(cluster, model(ns, "sleeper", after="1m", release="WhenAsleep", holdSeconds=600))
    home, standin = awake_on(cluster, gateways, ns, "sleeper")
    other = b if home == a else a
    standin.idle_for(120)
    wait_released(cluster, operator, ns, "sleeper")

    # A model that never sleeps is not given the sleeper's home (rule 4) ...
    apply(cluster, model(ns, "steady", served="qwen3:1.7b"))
    steady_node, _ = awake_on(cluster, gateways, ns, "steady")
    assert steady_node == other
    # ... but the home fills up all the same (a pod that is no model's).
    filler(cluster, ns, home)
    seen = Seen(cluster, ns, "sleeper")
    try:
        answer = ask(router, ns, timeout_s=900)
        wait_until("the sleeper waiting for a node", lambda: "WaitingForNode" in seen.reasons,
                   timeout=WAIT)
        assert not pods_of(cluster, ns, "sleeper")
        assert any(w.get("message") for w in seen.wakes), seen.wakes
        # A node that fits comes: the sleeper wakes there, and its status says the cost.
        [c] = add_nodes(cluster, ns, "c")
        status, body = answer.result(timeout=WAIT + 60)
    finally:
        seen.stop()
    [pod] = pods_of(cluster, ns, "sleeper")
    assert status == 200, (body, pod["status"].get("podIP"), sorted(gateways.by_ip),
                           sorted(gateways.runners))
    assert pod["spec"]["nodeName"] == c
    costs = [w["cost"] for w in seen.wakes if w.get("cost")]
    assert costs and all(re.search(rf"new claim on {c}\b.*download", x) for x in costs), (
        seen.wakes)
    assert home in costs[-1], costs  # the claim at home is kept, and said so
    wait_until("the wake recorded", lambda: idle_of(cluster, ns, "sleeper").get("wakes") == 1,
               timeout=WAIT)
    last = idle_of(cluster, ns, "sleeper").get("lastWake") or {}
    assert last.get("node") == c and last.get("warmCache") is False, last
    claims = claims_of(cluster, ns)
    # The claim at home is kept (storage.retain is false: it would go with the model).
    assert {k: v for k, v in claims.items() if k.startswith("sleeper-")} == {
        "sleeper-weights-0": home, "sleeper-weights-0-1": c}, claims
    assert gateways.busy_evictions == 0


def test_a_busy_model_never_yields_the_held_request_ends_503_with_the_reason(
    cluster: TestCluster, operator: OperatorProcess, gateways: Gateways, router: Router,
    ns: str
) -> None:
    a, b = add_nodes(cluster, ns, "a", "b")
    apply(cluster, model(ns, "waker", after="1m", release="WhenAsleep", holdSeconds=20,
                         priority=10))
    home, waker = awake_on(cluster, gateways, ns, "waker")
    filler(cluster, ns, b if home == a else a)
    waker.idle_for(120)
    wait_released(cluster, operator, ns, "waker")
    # A model that may sleep borrows the home, and streams.
    apply(cluster, model(ns, "streamer", served="qwen3:1.7b", after="1m", priority=0))
    node, streamer = awake_on(cluster, gateways, ns, "streamer")
    assert node == home
    stream = ask(router, ns, served="qwen3:1.7b", stream=True, timeout_s=900)
    wait_until("the stream in flight", lambda: streamer.door.in_flight == 1, timeout=WAIT)
    streamer.idle_for(3600)  # quiet long before the stream: only the stream keeps it busy

    # Its reading shows the stream: it is never asked, the held request ends 503.
    status, body = ask(router, ns).result(timeout=WAIT + 60)
    assert status == 503, body
    assert "did not wake within 20 s" in body, body
    assert streamer.yields_asked == 0, streamer
    # Its reading lags (quiet, as before the stream): it is asked, and its
    # gateway refuses at the call on its own counts; the request ends 503 again.
    streamer.lag({"in_flight": 0, "queued": 0, "arrived": 0, "idle_seconds": 3600.0,
                  "closed": False})
    second = ask(router, ns)
    wait_until("the busy gateway asked to yield", lambda: streamer.refused >= 1, timeout=WAIT)
    status, body = second.result(timeout=WAIT + 60)
    assert status == 503 and "did not wake within" in body, body
    assert streamer.closes == 0 and streamer.busy_closes == 0 and gateways.busy_evictions == 0
    assert pods_of(cluster, ns, "streamer") and not stream.done()
    assert not pods_of(cluster, ns, "waker")

    # The stream ends: it completes, the borrower yields, the waker wakes at home.
    streamer.lag(None)
    gateways.end_streams(ns, "streamer")
    stream_status, text = stream.result(timeout=WAIT)
    assert stream_status == 200 and text.rstrip().endswith("data: [DONE]"), text
    streamer.idle_for(3600)
    answers: list[tuple[int, str]] = []
    wait_until("a held request answered by the woken waker", lambda: answers.append(
        ask(router, ns).result(timeout=WAIT + 60)) or answers[-1][0] == 200, timeout=WAIT * 2)
    [pod] = pods_of(cluster, ns, "waker")
    assert pod["spec"]["nodeName"] == home
    assert f"{pod['metadata']['name']} here" in answers[-1][1]
    assert all(code == 503 for code, _ in answers[:-1]), answers
    # The pod that served the relayed request stays: the wake ends Awake.
    wait_until("the waker awake", lambda: idle_of(cluster, ns, "waker").get("state") == "Awake",
               timeout=WAIT)
    assert [p["metadata"]["uid"] for p in pods_of(cluster, ns, "waker")] == [
        pod["metadata"]["uid"]]
    assert streamer.closes >= 1 and streamer.busy_closes == 0
    assert gateways.busy_evictions == 0
    assert idle_of(cluster, ns, "streamer").get("resident") is False


def test_a_waker_takes_the_node_of_a_lower_priority_never_a_higher_or_a_never_sleeper(
    cluster: TestCluster, operator: OperatorProcess, gateways: Gateways, router: Router,
    ns: str
) -> None:
    add_nodes(cluster, ns, "a", "b")
    apply(cluster, model(ns, "waker", after="1m", release="WhenAsleep", holdSeconds=20,
                         priority=0))
    home, waker = awake_on(cluster, gateways, ns, "waker")
    waker.idle_for(120)
    wait_released(cluster, operator, ns, "waker")
    apply(cluster, model(ns, "steady", served="qwen3:1.7b"))
    apply(cluster, model(ns, "chat", served="gemma3:270m", after="10m", priority=10))
    _, steady = awake_on(cluster, gateways, ns, "steady")
    chat_node, chat = awake_on(cluster, gateways, ns, "chat")
    assert chat_node == home  # the only node a model without idle may not take
    chat.idle_for(40)  # quiet past the yield grace, within its own `after`

    status, body = ask(router, ns).result(timeout=WAIT + 60)
    assert status == 503 and "did not wake within" in body, body
    assert steady.yields_asked == 0 and chat.closes == 0  # never asked / never closed
    assert pods_of(cluster, ns, "chat") and pods_of(cluster, ns, "steady")

    chat.idle_for(700)  # now idle past its own `after`: it would be asleep anyway
    status, body = ask(router, ns).result(timeout=WAIT + 60)
    assert status == 200, (body, operator.log_tail(60))
    [pod] = pods_of(cluster, ns, "waker")
    assert pod["spec"]["nodeName"] == home
    assert steady.yields_asked == 0 and pods_of(cluster, ns, "steady")
    assert gateways.busy_evictions == 0
