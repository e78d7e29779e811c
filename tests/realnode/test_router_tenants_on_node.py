"""The router between tenants on the real node (issue 42, "On the real node").

The chart's router (`router.enabled`, two replicas on the real node) serves two
namespaces, `team-a` and `team-b` (`router.namespaces`: a Role in each).

- **A hostile tenant cannot take or move the other's traffic.** team-a runs a
  real llama-server LocalModel `chat` (one CPU, one thread) serving
  `gemma3:270m`. team-b, the hostile tenant, has a LocalModel of the same
  name `chat` (so both pods are `chat-0`) whose `spec.model` is
  `team-a/gemma3:270m`, a name crafted to capture team-a's requests. It is
  placed on a kwok node (`avx2-0`): the machine has 2 cores, and a second
  real model does not fit. kwok runs no containers, so its "gateway" is a
  stand-in on the host at the pod IP kwok gave that pod (10.244.0.0/16; the
  address added to `lo`, removed afterwards; the router pods, on the pod
  network 10.85.0.0/24, reach it through the host: the fixture waits for both
  router pods' reads of its `/slots`):
  a stand-in for a second node's CPUs, playing a gateway image that lists and
  reports what it likes (tests/realnode/router_standin.py: `/slots` full with
  a queue of 500 and session keys of its choosing, `/speed` 100 s a request;
  it records every request it receives). Through the router's Service, with
  the official `openai` client and `X-LocalModel-Session` sessions over several
  turns, by `team-a/gemma3:270m` and by the bare name: every turn is answered
  by team-a's replica (`X-LocalModel-Replica` is `team-a/chat-0@<uid>`) as its
  session's `owner` (`X-LocalModel-Route`), and the stand-in receives none of
  team-a's requests (neither its Authorization nor its prompts); team-b's model
  is reached only as `team-b/team-a/gemma3:270m`, and gets only that request.
  **The bound on team-a's time to first token:** its own engine's prefill
  plus under 1 s of queueing at its gateway, read from the victim gateway's
  ledger (`queue_wait_s` < 1 s on every turn; the TTFTs printed), not from the
  client's clock.
- **A body flood holding every one of the router's places.** Each router pod
  gets places - 1 concurrent clients (`--places`, 64 by default) sending the
  worst bodies within the body limit (1 MiB of `{"x":[{},{},...]}` structure,
  benchmarks/router_hostile.py), addressed to team-b's model, whose stand-in
  holds each 1 s before answering, so that each holds its place while relayed;
  the router's own gauge (`localmodel_router_admission{what="places_held"}`)
  shows places - 1 held on each pod before a normal chat through the Service
  is asked, and answered (200, clean text); the flood lasts 15 s at least and
  until that answer, and every flood body is relayed (200, no 503 for want of
  a place). The flood goes to the pods' IPs from the host (on the pod network):
  a `kubectl port-forward` per pod would put the API server's and the
  kubelet's streams, not the router, under the load on this 2-core machine.
  Afterwards neither router pod restarted, and each container's memory peak
  (cgroup v1 `memory.max_usage_in_bytes`) stayed under its `limits.memory`.
- **Keys through the router, both engines.** A keys Secret and an Ollama
  LocalModel naming it, then a llama-server one (one at a time: CPUs): with
  the key each answers through the router (the `openai` client with
  `api_key=KEY`; the `ollama` client with an `Authorization: Bearer` header
  for Ollama), without a key (or with a wrong one) 401; `/v1/models` and
  `/api/tags` list the model to the key and not to a caller without it.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ollama as ollama_client
import openai
import pytest

from benchmarks.gateway_hostile import exchange
from localmodel.contract import LABEL_NAME
from localmodel.engines import llama_server
from localmodel.engines import ollama as ollama_engine
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT, LEDGER_PATH
from localmodel.router.config import PLACES, RouterConfig
from tests.builders import MakeLocalModel
from tests.harness.chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.engines import CHAT_TEMPLATE_ENV, MODEL_TAG
from tests.harness.processes import wait_for
from tests.realnode.conftest import VOLUMES, VOLUMES_DIR
from tests.realnode.journey import (
    Journey,
    Manifest,
    clean_reply,
    condition,
    container_cgroup,
    http_json,
    local_volumes,
)
from tests.realnode.router_standin import HostileGateway
from tests.realnode.test_router_on_node import (
    REPLICA,
    ROUTE,
    ROUTER_PORT,
    ROUTER_SELECTOR,
    ROUTER_SERVICE,
    SESSION,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

TEAM_A, TEAM_B = "team-a", "team-b"
NAME = "chat"  # both tenants' LocalModel: both pods are chat-0
HOSTILE_SERVED = f"{TEAM_A}/{MODEL_TAG}"  # team-b's spec.model, crafted to capture team-a's
HOSTILE_NODE = "avx2-0"  # a kwok node of the fixture (tests/fixtures/nodes.yaml)
SESSIONS = ("alice", "bob")
TURNS = 3
QUEUE_BOUND = 1.0  # s: team-a's queue wait at its gateway, every turn (the ledger's)
A_AUTH = f"team-a-secret-{secrets.token_hex(8)}"
A_PROMPT = "Team-a asks: name three colours."
FLOOD_SECONDS = 15.0  # at least; and until the normal chat is answered
KEY = f"lm-router-{secrets.token_hex(12)}"


def lm_path(namespace: str, name: str = "") -> str:
    return f"/apis/localmodel.dev/v1alpha1/namespaces/{namespace}/localmodels" + (
        f"/{name}" if name else "")


def pods_of(journey: Journey, namespace: str, name: str) -> list[Manifest]:
    items = journey.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_NAME}={name}")
    return [p for p in items["items"] if not p["metadata"].get("deletionTimestamp")]


def replica_id(pod: Manifest) -> str:
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}@{meta['uid']}"


def model(journey: Journey, namespace: str, name: str, engine: str, node: str,
          served: str = MODEL_TAG, **spec: Any) -> Manifest:
    placement: Manifest = {"nodeSelector": {"kubernetes.io/hostname": node}}
    if node != journey.node:
        placement["exclusive"] = False  # as test_containment_on_node.py's bystander
    return (MakeLocalModel(name, namespace).model(served).engine(engine)
            .gguf(journey.model_file_url(), journey.sha256).cpu(1).context(1024)
            .spec(placement=placement,
                  storage={"storageClassName": "local-disk"},
                  env=[{"name": k, "value": v} for k, v in CHAT_TEMPLATE_ENV.items()], **spec)
            .manifest())


def ready_pod(journey: Journey, namespace: str, name: str) -> Manifest | None:
    pods = pods_of(journey, namespace, name)
    if len(pods) == 1 and condition(pods[0], "Ready") == "True" and pods[0]["status"].get(
            "podIP") and condition(journey.get(lm_path(namespace, name)), "Ready") == "True":
        return pods[0]
    return None


def deploy(journey: Journey, manifest: Manifest) -> Manifest:
    """Create the LocalModel; its pod once it and the model are Ready."""
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    began = time.monotonic()
    journey.cluster.api().create(lm_path(ns), manifest)
    try:
        pod: Manifest = wait_for(f"{ns}/{name} Ready", lambda: ready_pod(journey, ns, name), 600,
                                 interval=0.5)
    except Exception:
        print(journey.kubectl("get", "localmodel,pod,pvc,events", "-n", ns, "-o", "wide",
                              check=False)[-6000:])
        raise
    journey.timings.add(f"{ns}/{name}: created -> Ready", time.monotonic() - began)
    return pod


def delete(journey: Journey, namespace: str, name: str) -> None:
    journey.cluster.api().status_of("DELETE", lm_path(namespace, name))
    wait_for(f"{namespace}/{name}'s pods gone", lambda: not journey.get(
        f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_NAME}={name}")["items"],
        180, interval=0.5)


def router_pods(journey: Journey) -> list[Manifest]:
    items = journey.get(f"/api/v1/namespaces/{CHART_NAMESPACE}/pods?labelSelector="
                        f"{ROUTER_SELECTOR}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def get(url: str, key: str | None = None) -> tuple[int, Any]:
    return http_json(url, timeout=180, key=key)


def post(url: str, body: Manifest, key: str | None = None) -> tuple[int, Any]:
    return http_json(url, body, timeout=180, key=key)


def listed(url: str, key: str | None = None) -> tuple[list[str], list[str]]:
    """(/v1/models ids, /api/tags names) as the caller with `key` sees them."""
    status, models = get(f"{url}/v1/models", key)
    assert status == 200, models
    status, tags = get(f"{url}{ollama_engine.TAGS_PATH}", key)
    assert status == 200, tags
    return [m["id"] for m in models["data"]], [m["name"] for m in tags["models"]]


@dataclass
class Tenants:
    hostile: HostileGateway
    hostile_pod: Manifest


@pytest.fixture(scope="module")
def tenants(journey: Journey) -> Iterator[Tenants]:
    """Both namespaces, the router on serving them, team-b's hostile model on a
    kwok node with its stand-in gateway at its pod IP; all undone afterwards."""
    api = journey.cluster.api()
    for ns in (TEAM_A, TEAM_B):
        api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    journey.cluster.apply(local_volumes(journey.node, 3, VOLUMES_DIR, first=VOLUMES + 20))
    hostile: HostileGateway | None = None
    router_on = False
    try:
        for ns in (TEAM_A, TEAM_B):
            account = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
            wait_for(f"{ns}'s default ServiceAccount",
                     lambda account=account: api.status_of("GET", account) == 200, 30)
        router_on = True
        seconds = journey.upgrade_chart(*journey.router_settings(),
                                        "--set", f"router.namespaces={{{TEAM_A},{TEAM_B}}}")
        journey.timings.add("tenants: helm upgrade, router on for team-a and team-b", seconds)
        args = router_pods(journey)[0]["spec"]["containers"][0].get("args") or []
        assert f"--namespaces={TEAM_A},{TEAM_B}" in args, args
        api.create(lm_path(TEAM_B), model(journey, TEAM_B, NAME, llama_server.NAME,
                                          HOSTILE_NODE, served=HOSTILE_SERVED,
                                          # not the catalog's name: sized by hand
                                          memory="1Gi"))
        pod: Manifest = wait_for("team-b's pod Ready on the kwok node", lambda: next(
            (p for p in pods_of(journey, TEAM_B, NAME) if condition(p, "Ready") == "True"
             and p["status"].get("podIP")), None), 180, interval=0.5)
        assert pod["spec"]["nodeName"] == HOSTILE_NODE and pod["metadata"]["name"] == f"{NAME}-0"
        hostile = HostileGateway(pod["status"]["podIP"], sessions=list(SESSIONS),
                                 watch=[A_AUTH, A_PROMPT, "Say hello"])
        hostile.start()
        # The router pods reach it: their reads of its /slots arrive, from the pod network.
        routers = {p["status"]["podIP"] for p in router_pods(journey)}
        wait_for("both router pods to read the stand-in's /slots", lambda: routers <= {
            s.peer for s in hostile.seen if s.path == "/slots"}, 120, interval=0.5)
        print(f"team-b's stand-in at {hostile.ip} (kwok's pod IP), read from "
              f"{sorted({s.peer for s in hostile.seen})} (the router pods: {sorted(routers)})")
        yield Tenants(hostile=hostile, hostile_pod=pod)
    finally:
        if hostile is not None:
            hostile.stop()
        for ns in (TEAM_A, TEAM_B):
            for lm in (journey.get(lm_path(ns)).get("items") or []):
                api.status_of("DELETE", lm_path(ns, lm["metadata"]["name"]))
        for ns in (TEAM_A, TEAM_B):
            pods = f"/api/v1/namespaces/{ns}/pods"
            wait_for(f"{ns}'s pods gone", lambda pods=pods: not journey.get(pods)["items"], 180,
                     interval=1)
        if router_on:
            journey.upgrade_chart("--set", "router.enabled=false",
                                  "--set-json", "router.namespaces=[]")
        for ns in (TEAM_A, TEAM_B):
            api.status_of("DELETE", f"/api/v1/namespaces/{ns}")


def ledger(journey: Journey, pod: str) -> list[Manifest]:
    """The victim gateway's ledger, through the API server's pod proxy."""
    doc = json.loads(journey.kubectl("get", "--raw", f"/api/v1/namespaces/{TEAM_A}/pods/"
                                     f"{pod}:{ADMIN_PORT}/proxy{LEDGER_PATH}"))
    entries: list[Manifest] = doc["entries"]
    return entries


def test_a_hostile_tenant_cannot_take_the_others_requests_and_a_flood_leaves_the_router_whole(
    journey: Journey, tenants: Tenants) -> None:
    hostile = tenants.hostile
    pod = deploy(journey, model(journey, TEAM_A, NAME, llama_server.NAME, journey.node))
    try:
        victim = replica_id(pod)
        hostile_id = replica_id(tenants.hostile_pod)
        assert victim != hostile_id and pod["metadata"]["name"] == f"{NAME}-0"
        with journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url:
            wanted = {MODEL_TAG, f"{TEAM_B}/{HOSTILE_SERVED}"}
            wait_for("the router to list both tenants' models", lambda: wanted <= set(
                listed(url)[0]), 120, interval=0.5)
            print(f"listed: {listed(url)}")
            before, reads_before = len(hostile.requests()), len(hostile.seen)
            turns = _sessions_stay_with_team_a(url, victim)
            # Its lies were read meanwhile: /slots by the router pods, with their mark
            # (so it "listed" its keys to them), /speed on the admin port.
            lies = [(s.path, "x-localmodel-router-mark" in s.headers)
                    for s in hostile.seen[reads_before:] if s.path in ("/slots", "/speed")]
            assert ("/slots", True) in lies and ("/speed", False) in lies, lies
            # team-b's model by its qualified name only: answered by the stand-in.
            hostile_request = f"to-team-b-{secrets.token_hex(4)}"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="team-b-caller", timeout=60,
                                   max_retries=0, default_headers={"X-Request-Id": hostile_request})
            raw = client.chat.completions.with_raw_response.create(
                model=f"{TEAM_B}/{HOSTILE_SERVED}", max_tokens=4,
                messages=[{"role": "user", "content": "for team-b"}])
            assert raw.headers[REPLICA] == hostile_id, raw.headers
            assert raw.parse().choices[0].message.content == "team-b here"
            got = [s for s in hostile.requests()[before:] if s.method == "POST"]
            assert len(got) == 1 and b"for team-b" in got[0].body_head, [
                (s.method, s.path, s.headers, s.body_head) for s in got]
            print(f"team-b's stand-in got its one request: {got[0].path} {got[0].headers}")
            # Nothing of team-a's ever reached the stand-in, on any path or port.
            leaked = [(s.port, s.method, s.path, s.watched) for s in hostile.seen
                      if s.watched or A_AUTH in json.dumps(s.headers)
                      or s.headers.get("x-request-id", "").startswith("a-")]
            assert not leaked, leaked
        # The bound, from the victim gateway's ledger: team-a never queued behind anything.
        entries = {e["request_id"]: e for e in ledger(journey, pod["metadata"]["name"])}
        mine = [entries[r] for r in turns]
        print("team-a's turns (ledger): " + ", ".join(
            f"{e['request_id']}: queue {e['queue_wait_s']} s, TTFT {e['ttft_s']} s, "
            f"routed {e['routed']}" for e in mine))
        assert all(e["status"] == 200 and e["routed"] == "owner" and e["queue_wait_s"] is not None
                   and e["queue_wait_s"] < QUEUE_BOUND for e in mine), mine
        _flood(journey, hostile)
    finally:
        delete(journey, TEAM_A, NAME)


def _sessions_stay_with_team_a(url: str, victim: str) -> list[str]:
    """TURNS turns of each session, alternating the qualified and the bare name:
    each answered by team-a's replica as the session's owner; the request ids."""
    ids: list[str] = []
    history: dict[str, list[dict[str, str]]] = {s: [] for s in SESSIONS}
    for turn in range(TURNS):
        for session in SESSIONS:
            name = f"{TEAM_A}/{MODEL_TAG}" if turn % 2 == 0 else MODEL_TAG
            request_id = f"a-{session}-{turn}-{secrets.token_hex(3)}"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=A_AUTH, timeout=120,
                                   max_retries=0, default_headers={
                                       SESSION: session, "X-Request-Id": request_id})
            history[session].append({"role": "user", "content": f"{A_PROMPT} ({turn})"})
            raw = client.chat.completions.with_raw_response.create(
                model=name, messages=history[session], max_tokens=12, temperature=0)  # type: ignore[arg-type]
            reply = clean_reply(raw.parse().choices[0].message.content)
            history[session].append({"role": "assistant", "content": reply})
            assert raw.headers[REPLICA] == victim, (name, raw.headers)
            assert raw.headers[ROUTE] == "owner", (name, raw.headers[ROUTE])
            ids.append(request_id)
    return ids


# ---- the body flood -------------------------------------------------------------


def _places(journey: Journey) -> int:
    args = router_pods(journey)[0]["spec"]["containers"][0].get("args") or []
    for i, arg in enumerate(args):
        if arg.startswith("--places="):
            return int(arg.split("=", 1)[1])
        if arg == "--places":
            return int(args[i + 1])
    return PLACES


def _structure_body() -> bytes:
    """The worst body within the limit: structure only, routed to team-b's model."""
    fill = RouterConfig().max_body_bytes - 64
    head = json.dumps({"model": f"{TEAM_B}/{HOSTILE_SERVED}", "stream": False})[:-1].encode() + b","
    return head + b'"x":[' + b"{}," * ((fill - len(head)) // 3) + b"{}]}"


async def _flood_one(host: str, clients: int, body: bytes, stop: threading.Event,
                     answers: Counter[str]) -> None:
    async def client(i: int) -> None:
        route = ("/api/chat", "/v1/chat/completions")[i % 2]
        while not stop.is_set():
            try:
                status, error = await exchange(host, GATEWAY_PORT, route, body)
            except (OSError, EOFError, IndexError, ValueError) as exc:
                status, error = 0, type(exc).__name__
            answers[f"{status} {error[:40]}".strip()] += 1

    await asyncio.gather(*(client(i) for i in range(clients)))


def _places_held(pod: Manifest) -> int:
    """The router pod's places held now (its admin port's metrics, read from the host)."""
    url = f"http://{pod['status']['podIP']}:{ADMIN_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r'^localmodel_router_admission\{what="places_held"\} (\S+)$', text, re.M)
    assert found, text[-2000:]
    return int(float(found[1]))


def _memory(pod: Manifest) -> tuple[int, int]:
    """(the router container's cgroup memory peak, its limit), bytes."""
    peak = int((container_cgroup("memory", pod, "router") / "memory.max_usage_in_bytes")
               .read_text())
    limit = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    number = next((int(limit[:-2]) * m for u, m in units.items() if limit.endswith(u)), None)
    return peak, number if number is not None else int(limit)


def _flood(journey: Journey, hostile: HostileGateway) -> None:
    places = _places(journey)
    pods = router_pods(journey)
    assert len(pods) == 2
    body = _structure_body()
    answers = {p["metadata"]["name"]: Counter[str]() for p in pods}
    stop = threading.Event()
    hostile.hold = 1.0
    seen_before = len(hostile.seen)

    def run() -> None:
        async def both() -> None:
            await asyncio.gather(*(_flood_one(p["status"]["podIP"], places - 1, body, stop,
                                              answers[p["metadata"]["name"]]) for p in pods))
        asyncio.run(both())

    began = time.monotonic()
    thread = threading.Thread(target=run, name="flood", daemon=True)
    thread.start()
    try:
        held = {p["metadata"]["name"]: 0 for p in pods}

        def every_place_but_one() -> bool:
            for p in pods:
                held[p["metadata"]["name"]] = max(held[p["metadata"]["name"]], _places_held(p))
            return all(n >= places - 1 for n in held.values())

        wait_for(f"{places - 1} places held on each router pod", every_place_but_one, 60,
                 interval=0.2)
        with journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=A_AUTH, timeout=120,
                                   max_retries=0)
            asked = time.monotonic()
            chat = client.chat.completions.create(
                model=MODEL_TAG, max_tokens=12, temperature=0,
                messages=[{"role": "user", "content": "Say hello in three words."}])
            reply = clean_reply(chat.choices[0].message.content)
            print(f"normal chat during the flood: {reply!r} in {time.monotonic() - asked:.1f} s "
                  f"(places held on the router pods before it was asked: {held})")
        # The flood goes on past the chat's answer, for FLOOD_SECONDS at least.
        time.sleep(max(0.0, began + FLOOD_SECONDS - time.monotonic()))
    finally:
        stop.set()
        thread.join(120)
    flooded = time.monotonic() - began
    assert not thread.is_alive()
    relayed = sum(1 for s in hostile.seen[seen_before:] if s.body_bytes > 1000)
    print(f"flood: {places - 1} clients per router pod ({places} places) for {flooded:.0f} s;"
          f" bodies of {len(body)} bytes; relayed to the stand-in: {relayed}; answers: "
          f"{ {k: dict(v) for k, v in answers.items()} }")
    assert relayed >= 2 * (places - 1), relayed  # every client got at least one relayed
    # Every flood body was relayed and answered: none refused for want of a place.
    assert all(set(a) == {"200"} for a in answers.values()), answers
    for p in router_pods(journey):
        name = p["metadata"]["name"]
        assert name in answers, (name, sorted(answers))  # the same pods: none replaced
        restarts = {s["name"]: s["restartCount"] for s in p["status"]["containerStatuses"]}
        peak, limit = _memory(p)
        print(f"router pod {name}: restarts {restarts}; memory peak {peak / 1024**2:.1f} MiB "
              f"of a {limit / 1024**2:.0f} MiB limit")
        assert all(n == 0 for n in restarts.values()), restarts
        assert peak < limit, (peak, limit)


# ---- keys -----------------------------------------------------------------------


@pytest.mark.parametrize("engine", [ollama_engine.NAME, llama_server.NAME])
def test_a_model_with_keys_answers_through_the_router_with_a_key_and_refuses_without(
    journey: Journey, tenants: Tenants, engine: str,
) -> None:
    name, secret = f"keyed-{engine}", f"keyed-{engine}-keys"
    api = journey.cluster.api()
    secret_path = journey.keys_secret(TEAM_A, secret, KEY, "router-realnode")
    manifest = model(journey, TEAM_A, name, engine, journey.node)
    manifest["spec"]["gateway"] = {"auth": {"keysSecretRef": {"name": secret,
                                                              "key": "keys.json"}}}
    try:
        deploy(journey, manifest)
        with journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url:
            wait_for("the router to list the keyed model to its key", lambda: all(
                MODEL_TAG in names for names in listed(url, KEY)), 120, interval=0.5)
            without = listed(url)
            wrong = listed(url, KEY + "x")
            print(f"{engine}: listed to the key {listed(url, KEY)}, without a key {without}, "
                  f"to a wrong key {wrong}")
            assert all(MODEL_TAG not in names for names in (*without, *wrong)), (without, wrong)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, timeout=180, max_retries=0)
            chat = client.chat.completions.create(
                model=MODEL_TAG, max_tokens=12, temperature=0,
                messages=[{"role": "user", "content": "Say hello in three words."}])
            print(f"{engine}, openai client with the key: "
                  f"{clean_reply(chat.choices[0].message.content)!r}")
            if engine == ollama_engine.NAME:
                reply = ollama_client.Client(host=url, timeout=180, headers={
                    "Authorization": f"Bearer {KEY}"}).generate(
                    model=MODEL_TAG, prompt="Say hello in three words.",
                    options={"num_predict": 8, "temperature": 0})
                print(f"{engine}, ollama client with the key: {clean_reply(reply.response)!r}")
                with pytest.raises(ollama_client.ResponseError) as refused:
                    ollama_client.Client(host=url, timeout=60).generate(
                        model=MODEL_TAG, prompt="hi", options={"num_predict": 2})
                assert refused.value.status_code == 401, refused.value
            body = {"model": MODEL_TAG, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "hi"}]}
            status, answer = post(f"{url}/v1/chat/completions", body)
            assert status == 401, (status, answer)
            status, answer = post(f"{url}/v1/chat/completions", body, KEY + "x")
            assert status == 401, (status, answer)
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=f"{url}/v1", api_key="not-the-key", timeout=60,
                              max_retries=0).chat.completions.create(
                    model=MODEL_TAG, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    finally:
        delete(journey, TEAM_A, name)
        api.status_of("DELETE", secret_path)
