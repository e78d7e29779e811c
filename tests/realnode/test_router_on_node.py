"""The router on the real node (docs/router.md): the chart installs it (two
replicas, `router.enabled`), and models are answered through its one Service by
their served name, with the official `openai` and `ollama` clients; a client
that leaves through the router leaves the engine idle within a second of the
gateway seeing it go (the gateway's own log line); a router replica killed
mid-stream fails only that stream, and the other replica serves the session's
next turn on the same owner (`X-LocalModel-Replica`, `X-LocalModel-Route`).

What this machine cannot hold, and so is not here: two models at once (each
model replica takes a whole CPU plus its gateway's quarter, on a 2-core node,
and holds its node by default) and a model with two replicas (replicas go on
different nodes; there is one real node). The models here take turns: a
llama-server model (openai client), then an Ollama model (ollama client), each
by name through the same Service. Sessions over two model replicas, chosen by
rendezvous hashing alike on both router replicas, are the core's tests
(tests/router/).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import ollama as ollama_client
import openai
import pytest

from localmodel.engines import llama_server
from localmodel.engines import ollama as ollama_engine
from tests.harness.chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.chart import RELEASE
from tests.harness.engines import MODEL_TAG
from tests.harness.processes import wait_for
from tests.realnode.journey import (
    LLAMA_SERVER_CALLS,
    LONG_PROMPT,
    PROMPT,
    Journey,
    clean_reply,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NAME = "gemma-routed"
ROUTER_SELECTOR = "app.kubernetes.io/component=router"
ROUTER_SERVICE = f"{RELEASE}-router"
ROUTER_PORT = 80  # the chart's router.service.port
ROUTE, REPLICA, SESSION = "X-LocalModel-Route", "X-LocalModel-Replica", "X-LocalModel-Session"


def router_pods(journey: Journey) -> list[str]:
    items = journey.get(f"/api/v1/namespaces/{CHART_NAMESPACE}/pods?labelSelector="
                        f"{ROUTER_SELECTOR}")["items"]
    return sorted(p["metadata"]["name"] for p in items
                  if not p["metadata"].get("deletionTimestamp")
                  and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}]))


@pytest.fixture(scope="module")
def router(journey: Journey) -> Iterator[None]:
    """The chart's router, turned on by `helm upgrade` (pinned to the real node,
    a small CPU request: the machine has 2 cores); off again afterwards."""
    seconds = journey.upgrade_chart(*journey.router_settings())
    journey.timings.add("helm upgrade: router on (two replicas Ready)", seconds)
    assert len(router_pods(journey)) == 2
    try:
        yield
    finally:
        journey.upgrade_chart("--set", "router.enabled=false")


def _listed(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30, max_retries=0)
    return [m.id for m in client.models.list().data]


def _wait_listed(journey: Journey, url: str) -> None:
    """The router lists the model once its replica is Ready (its watch follows)."""
    wait_for("the router to list the model", lambda: MODEL_TAG in _listed(url), 60,
             interval=0.5)


def test_the_router_answers_both_engines_by_name_and_stops_work_when_the_caller_leaves(
    journey: Journey, router: None
) -> None:
    with journey.deployed(NAME, llama_server.NAME):
        pod = journey.pod_of(NAME)
        with journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url:
            _wait_listed(journey, url)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120,
                                   max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL_TAG, messages=[{"role": "user", "content": PROMPT}],
                max_tokens=16, temperature=0)
            answer = clean_reply(raw.parse().choices[0].message.content)
            assert raw.headers[REPLICA] == _replica_id(pod)
            assert raw.headers[ROUTE].startswith("owner"), raw.headers[ROUTE]
            print(f"through the router (openai, llama-server): {answer!r}")
            # The caller leaves: from the gateway's own log line on, idle within a second.
            # (10 s of patience: the loaded machine, a port-forward and the router in the way)
            left = journey.client_gives_up(url, pod, LLAMA_SERVER_CALLS, patience=10.0)
        journey.timings.add(f"{NAME}: client through the router left -> gateway saw it",
                            left.gateway_at)
        journey.timings.add(f"{NAME}: gateway saw it -> engine idle", left.after_gateway)
        assert left.after_gateway <= 1.0, (
            f"the engine worked {left.after_gateway:.1f} s after the gateway saw its caller go")
        _killed_router_fails_only_its_stream(journey, pod)

    # Then an Ollama model, by the same name, through the same Service.
    with (journey.deployed(NAME, ollama_engine.NAME),
          journey.port_forward(f"svc/{ROUTER_SERVICE}", ROUTER_PORT, CHART_NAMESPACE) as url):
        wait_for("the router to list the Ollama model", lambda: MODEL_TAG in [
            m.model for m in ollama_client.Client(host=url, timeout=30).list().models], 60,
            interval=0.5)
        reply = ollama_client.Client(host=url, timeout=120).generate(
            model=MODEL_TAG, prompt=PROMPT, options={"num_predict": 8, "temperature": 0})
        print(f"through the router (ollama, Ollama): {clean_reply(reply.response)!r}")


def _stream_until_killed(url: str, session: str, request_id: str,
                         kill: Any) -> tuple[dict[str, str], str, BaseException | None]:
    """A long streamed chat through one router pod, killed after a few tokens:
    (its headers, the text it got, how the stream ended)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0,
                           default_headers={SESSION: session, "X-Request-Id": request_id})
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_TAG, messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=4000, temperature=0, stream=True)
    headers = dict(raw.headers)
    text, ended = "", None
    try:
        for i, chunk in enumerate(raw.parse()):
            text += "".join(c.delta.content or "" for c in chunk.choices)
            if i == 5:
                kill()
    except Exception as exc:  # the stream's failure is the point
        ended = exc
    return headers, text, ended


def _replica_id(pod: dict[str, Any]) -> str:
    """How the router names a replica (router/table.py `Replica.id`)."""
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}@{meta['uid']}"


def _killed_router_fails_only_its_stream(journey: Journey, pod: dict[str, Any]) -> None:
    owner, owner_id = pod["metadata"]["name"], _replica_id(pod)
    first, second = router_pods(journey)
    session = f"s-{secrets.token_hex(4)}"
    request_id = f"killed-{secrets.token_hex(4)}"

    def kill() -> None:
        journey.cluster.api().request(
            "DELETE", f"/api/v1/namespaces/{CHART_NAMESPACE}/pods/{first}",
            {"gracePeriodSeconds": 0})

    with journey.port_forward(f"pod/{first}", 8080, CHART_NAMESPACE) as url:
        headers, text, ended = _stream_until_killed(url, session, request_id, kill)
    assert headers[REPLICA.lower()] == owner_id and headers[ROUTE.lower()].startswith("owner")
    assert ended is not None, f"the stream survived its router's death: {text[-200:]!r}"
    # The gateway saw its caller (the killed router) go, and stopped the engine's work.
    record = journey.gateway_record(owner, request_id, timeout=30)
    assert record["outcome"] == "cancelled_disconnect", record
    # The session's next turn, through the other router replica: the same owner.
    with journey.port_forward(f"pod/{second}", 8080, CHART_NAMESPACE) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120,
                               max_retries=0, default_headers={SESSION: session})
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_TAG, max_tokens=8, temperature=0, messages=[
                {"role": "user", "content": LONG_PROMPT},
                {"role": "assistant", "content": text or "1"},
                {"role": "user", "content": PROMPT}])
        clean_reply(raw.parse().choices[0].message.content)
    assert raw.headers[REPLICA] == owner_id, raw.headers
    assert raw.headers[ROUTE].startswith("owner"), raw.headers[ROUTE]
    print(f"router {first} killed after {len(text)} characters ({type(ended).__name__}); "
          f"the next turn through {second}: {raw.headers[ROUTE]} on {owner}")
