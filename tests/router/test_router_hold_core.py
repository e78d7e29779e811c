"""The pure parts of holding requests for a sleeping model: what the router
reads of a model's sleep (router/cluster.py, hostile fields read as absent),
who is held and until when, what an expired or refused request is told
(router/holding.py), --hold-per-model, and the /waiting document with its
parser (gateway_contract/waiting_answer.py) refusing hostile answers."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from localmodel.gateway_contract.waiting_answer import (
    MAX_BYTES,
    MAX_MODELS,
    BadWaiting,
    Waiting,
    WaitingModel,
    parse_waiting,
    waiting_document,
)
from localmodel.metrics import Counter
from localmodel.router.cluster import keep_model, keep_slice, route_table, sleep_of
from localmodel.router.config import config_from, parser
from localmodel.router.holding import (
    RETRY_CLOSED_S,
    Holding,
    caller_timeout,
    deadline_at,
    expired,
    foreground,
    open_replicas,
    refusal,
    retry_after,
)
from localmodel.router.metrics import RouterMetrics
from localmodel.router.table import IdleRoute, ModelRoute, Replica
from tests.builders import MakeLocalModel

pytestmark = pytest.mark.unit

Raw = dict[str, Any]


def sleeper(status: Raw | None = None, **idle: Any) -> Raw:
    body = MakeLocalModel("chat", "ai").spec(model="chat:1b", idle={"after": "30m", **idle})
    manifest = body.manifest()
    if status is not None:
        manifest["status"] = status
    return manifest


SLEEPS = IdleRoute()  # spec.idle set, nothing said of its sleep


def route(idle: IdleRoute | None = SLEEPS, wanted: int = 1, keyed: bool = False,
          replicas: tuple[Replica, ...] = ()) -> ModelRoute:
    return ModelRoute("ai", "chat:1b", replicas, keyed, "chat", wanted, idle)


# ---- what the router reads of a model's sleep -----------------------------------------


def test_a_sleeping_models_fields_are_read_from_spec_and_status() -> None:
    body = sleeper({"idle": {"state": "Waking", "wake": {"message": "waiting for small-0"},
                             "lastWake": {"seconds": 14.2}}}, holdSeconds=30)
    body["spec"]["replicas"] = 2
    entry = keep_model(body)
    assert entry.wanted == 2
    assert entry.idle == IdleRoute(30.0, "Waking", "waiting for small-0", 14.2)
    # Without spec.idle: never held, whatever the status says.
    plain = MakeLocalModel("chat", "ai").spec(model="chat:1b").manifest()
    plain["status"] = {"idle": {"state": "Asleep"}}
    assert keep_model(plain).idle is None and keep_model(plain).wanted == 1


@pytest.mark.parametrize("status", [
    {"idle": {"state": "Dreaming", "wake": {"message": 7}, "lastWake": {"seconds": -1}}},
    {"idle": {"state": ["Asleep"], "wake": "x", "lastWake": {"seconds": float("nan")}}},
    {"idle": {"lastWake": {"seconds": 10**400}, "wake": {"message": None}}},
    {"idle": {"lastWake": {"seconds": True}}},
    {"idle": "asleep"},
    "not an object",
])
def test_hostile_sleep_fields_read_as_absent_never_as_an_error(status: Any) -> None:
    body = sleeper(status, holdSeconds=10**9)
    body["spec"]["replicas"] = "three"
    entry = keep_model(body)
    assert entry.wanted == 1
    assert entry.idle == IdleRoute()  # hold 120 s, nothing said of the sleep


def test_a_wake_message_is_bounded_and_printable() -> None:
    idle = sleep_of(sleeper({"idle": {"wake": {"message": "\x1b[2J" + "x" * 5000}}}))
    assert idle is not None
    assert "\x1b" not in idle.wake_message and len(idle.wake_message) < 400


def test_the_doorman_is_never_a_replica_and_the_route_carries_the_sleep() -> None:
    entry = keep_model(sleeper({"idle": {"state": "Asleep"}}))
    pods = [{"addresses": [ip], "conditions": {"ready": True},
             "targetRef": {"kind": "Pod", "name": pod}}
            for pod, ip in (("chat-doorman", "10.0.0.9"), ("chat-0", "10.0.0.1"))]
    ready = keep_slice({"metadata": {"name": "chat-x", "namespace": "ai",
                                     "labels": {"kubernetes.io/service-name": "chat"}},
                        "addressType": "IPv4", "endpoints": pods})
    [only], _ = route_table([entry], [ready])
    assert [r.name for r in only.replicas] == ["chat-0"]
    assert (only.localmodel, only.wanted, only.resource) == ("chat", 1, "ai/chat")
    assert only.idle is not None and only.idle.state == "Asleep"


# ---- who is held, until when, what they are told --------------------------------------


def test_off_is_refused_at_once_and_asleep_is_held() -> None:
    assert refusal(route()) is None
    off = refusal(route(wanted=0))
    assert off is not None and "off (spec.replicas: 0)" in off.message
    never = refusal(route(idle=None))
    assert never is not None and never.message == "model ai/chat:1b has no Ready replica"
    assert never.headers == {}
    keyed = refusal(route(keyed=True))  # no replica to check the key: not a wish to wake
    assert keyed is not None and "API keys" in keyed.message and "Retry-After" in keyed.headers


def test_the_deadline_is_the_least_of_caller_hold_and_router() -> None:
    r = route(IdleRoute(hold_seconds=120))
    assert deadline_at(0.0, 10.0, r, None, 600.0) == 130.0
    assert deadline_at(0.0, 10.0, r, 30.0, 600.0) == 30.0  # what is left of the caller's
    assert deadline_at(0.0, 10.0, r, None, 50.0) == 60.0
    assert [caller_timeout(v) for v in ("12.5", "0", "-1", "nan", "inf", "x", None)] == [
        12.5, None, None, None, None, None, None]


def test_an_expired_request_is_told_the_reason_and_when_to_come_back() -> None:
    r = route(IdleRoute(wake_message="waiting for small-0, where ai/gemma is serving 1 request",
                        last_wake_seconds=40.0))
    told = expired(r, 12.2, 12.0)
    assert told.status == 503 and told.headers == {"Retry-After": "28"}  # ceil(40 - 12.2)
    assert expired(r, 0.6, 0.5).message.startswith("ai/chat did not wake within 0.5 s: ")
    assert told.message == ("ai/chat did not wake within 12 s: waiting for small-0, where "
                            "ai/gemma is serving 1 request")
    assert retry_after(r, 100.0) == 1  # never less than a second
    assert retry_after(route(), 0.0) == 30  # no wake measured yet


def test_a_replica_found_closed_is_left_alone_for_a_while() -> None:
    a, b = (Replica("ai", p, f"http://{p}", None, "u") for p in ("chat-0", "chat-1"))
    r = route(replicas=(a, b))
    assert open_replicas(r, {a.id: 100.0}, 101.0) == (b,)
    assert open_replicas(r, {a.id: 100.0}, 100.0 + RETRY_CLOSED_S) == (a, b)
    assert [foreground(v) for v in (None, "high", " Background ")] == [True, True, False]


def test_hold_per_model_is_bounded_by_the_places() -> None:
    def bound(*argv: str) -> int:
        return config_from(parser().parse_args(list(argv))).hold_per_model

    assert bound() == 16
    assert bound("--places", "8") == 2
    assert bound("--hold-per-model", "0") == 0
    assert bound("--hold-per-model", "40", "--places", "400") == 40
    with pytest.raises(Exception, match="hold-per-model"):
        bound("--hold-per-model", "-1")


# ---- /waiting -----------------------------------------------------------------------------


def test_the_waiting_document_round_trips_longest_waiting_first() -> None:
    models = [WaitingModel("ai/chat", 3, 2, 4.5), WaitingModel("team-b/embed", 1, 0, 9.25)]
    assert parse_waiting(waiting_document(7, models)) == Waiting(7, (models[1], models[0]))


def test_the_waiting_document_is_bounded() -> None:
    many = [WaitingModel(f"ns-{i}/{'m' * 200}", 1, 1, float(i)) for i in range(5000)]
    raw = waiting_document(1, many)
    assert len(raw) <= MAX_BYTES
    parsed = parse_waiting(raw)
    assert 0 < len(parsed.models) <= MAX_MODELS
    assert parsed.models[0].oldest_s == 4999.0  # the longest waiting kept


def _doc(**change: Any) -> bytes:
    entry = {"model": "ai/chat", "held": 2, "foreground": 1, "oldest_s": 3.0}
    return json.dumps({"serial": 4, "models": [{**entry, **change}]}).encode()


@pytest.mark.parametrize("raw", [
    b"", b"\xff\xfe", b"[]", b'{"serial": 1}', b'{"serial": -1, "models": []}',
    b'{"serial": 1.5, "models": []}', b'{"serial": true, "models": []}',
    b'{"serial": 1, "models": {}}', b'{"serial": 1, "models": [1]}',
    b'{"serial": 1, "models": [{"held": NaN}]}', b"[" * 100_000 + b"]" * 100_000,
    b'{"serial": ' + b"9" * 5000 + b', "models": []}',
    b" " * (MAX_BYTES + 1),
    json.dumps({"serial": 1, "models": [{"model": "ai/chat", "held": 1, "foreground": 0,
                                         "oldest_s": 1}] * 2}).encode(),
    json.dumps({"serial": 1, "models": [{}] * (MAX_MODELS + 1)}).encode(),
    _doc(model="../etc"), _doc(model="AI/chat"), _doc(model="ai/" + "m" * 300), _doc(model=7),
    _doc(held=-1), _doc(held=10**12), _doc(held="2"), _doc(foreground=3),
    _doc(oldest_s=-0.5), _doc(oldest_s=1e300), _doc(oldest_s="3"), _doc(oldest_s=None),
])
def test_a_hostile_waiting_answer_is_refused_whole(raw: bytes) -> None:
    with pytest.raises(BadWaiting):
        parse_waiting(raw)


# ---- the queue's order ------------------------------------------------------------------


class Table:
    """A route table a test changes."""

    def __init__(self, *routes: ModelRoute) -> None:
        self.table = routes

    def __call__(self) -> tuple[ModelRoute, ...]:
        return self.table


async def test_one_released_at_a_time_in_arrival_order_and_newcomers_join_the_end() -> None:
    asleep = route()
    table = Table(asleep)
    metrics = RouterMetrics(Counter("r", "reads"), lambda: 0)
    holding = Holding(4, table, time.monotonic, metrics)
    first, second = (holding.ticket(asleep, time.monotonic(), {}, 600.0) for _ in range(2))
    waits = [asyncio.create_task(holding.wait(t, asleep)) for t in (first, second)]
    await asyncio.sleep(0)
    assert [m.held for m in holding.waiting()] == [2] and not any(w.done() for w in waits)

    replica = Replica("ai", "chat-0", "http://chat-0", None, "u")
    table.table = (replace(asleep, replicas=(replica,)),)
    holding.nudge()
    got = await asyncio.wait_for(waits[0], 30)
    assert got.replicas == (replica,)
    # The second waits until the first was sent; one arriving now joins behind it.
    assert holding.queued(asleep) and not waits[1].done()
    third = holding.ticket(asleep, time.monotonic(), {"X-Priority": "background"}, 600.0)
    late = asyncio.create_task(holding.wait(third, asleep))
    await asyncio.sleep(0)
    assert [(m.held, m.foreground) for m in holding.waiting()] == [(2, 1)]
    holding.sent(first)
    await asyncio.wait_for(waits[1], 30)
    assert not late.done()
    holding.sent(second)
    await asyncio.wait_for(late, 30)
    for t in (first, second, third):
        holding.finish(t, "relayed")
    assert metrics.held_total.value(("relayed",)) == 3 and holding.waiting() == []


def test_the_cluster_source_tells_its_listeners_of_every_change() -> None:
    from kubernetes import client

    from localmodel.router.follow import ClusterSource

    source = ClusterSource(client.ApiClient(), namespaces=("ai",))
    told: list[int] = []
    source.listen(lambda: told.append(1))
    source.models[0].event({"type": "ADDED", "object": sleeper()})
    source.slices[0].event({"type": "BOOKMARK", "object": {"metadata": {}}})
    assert told == [1]
    [only] = source.routes()
    assert only.idle == IdleRoute() and only.resource == "ai/chat"
