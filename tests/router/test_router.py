"""The router (`localmodel router`) in front of REAL gateways (in-process),
each in front of the Ollama STAND-IN (tests/gateway/ollama_standin.py: not
Ollama; it speaks both APIs and shows when its caller left). The router with
the real llama-server is in test_router_engine.py.

Routing by the `model` field with the official `ollama` and `openai` clients,
the listing routes, the errors in each API's shape, cancellation through the
router, sessions kept on their owner and a spill recorded with both
estimates, and hostile /slots and /speed answers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import ollama
import openai
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway.owned import RouterMarks
from localmodel.gateway_contract.headers import ROUTE_HEADER
from localmodel.router.config import RouterConfig
from localmodel.router.owners import Owners
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.session import ranking, session_key
from localmodel.router.signing import session_salt
from localmodel.router.static import static_source
from tests.gateway.harness import RawClient, Rig, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

# The routers' signing key, as the chart's Secret gives every router replica.
KEY = Ed25519PrivateKey.generate()
SALT = session_salt(KEY)
CONFIG = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                      admin_port=0, poll_interval=3600.0,  # tests poll by hand
                      signing_key=KEY)

RouterFactory = Callable[..., Awaitable[tuple[RunningRouter, list[str]]]]


@pytest.fixture
async def make_router() -> AsyncIterator[RouterFactory]:
    started: list[RunningRouter] = []

    async def make(replicas: list[str], **overrides: Any) -> tuple[RunningRouter, list[str]]:
        log: list[str] = []
        config = RouterConfig(**{**CONFIG.__dict__, **overrides})
        running = await start_router(config, static_source(replicas), log.append)
        started.append(running)
        return running, log

    yield make
    for running in reversed(started):
        await running.stop()


def _replica(rig: Rig) -> str:
    return f"{rig.url}|{rig.admin_url}"


async def _two_models(make_rig: RigFactory) -> tuple[Rig, Rig]:
    alpha = await make_rig(StandinOllama(model="alpha:1b", tokens=5), model="alpha:1b")
    beta = await make_rig(StandinOllama(model="beta:1b", tokens=5), model="beta:1b")
    return alpha, beta


# ---- one endpoint, both APIs ----------------------------------------------------------


async def test_the_model_field_picks_the_model_with_the_official_clients(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    alpha, beta = await _two_models(make_rig)
    router, log = await make_router([f"alpha:1b={_replica(alpha)}", f"beta:1b={_replica(beta)}"])
    client = ollama.AsyncClient(host=router.url)
    answer = await client.chat(model="alpha:1b", messages=[{"role": "user", "content": "hi"}])
    assert answer.done and answer.message.content
    parts = [p async for p in await client.generate(model="beta:1b", prompt="hi", stream=True)]
    assert len(parts) > 1 and parts[-1].done
    tags = await client.list()
    assert sorted(m.model or "" for m in tags.models) == ["alpha:1b", "beta:1b"]
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused",
                                  max_retries=0) as oai:
        done = await oai.chat.completions.create(
            model="beta:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert done.choices[0].message.content
        chunks = [c async for c in await oai.chat.completions.create(
            model="alpha:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            stream=True)]
        assert len(chunks) > 1
        assert sorted(m.id for m in (await oai.models.list()).data) == ["alpha:1b", "beta:1b"]
    assert [g.path for g in alpha.standin.generations] == ["/api/chat", "/v1/chat/completions"]
    assert [g.path for g in beta.standin.generations] == ["/api/generate",
                                                          "/v1/chat/completions"]
    lines = [json.loads(line) for line in log]
    assert [(d["model"], d["status"], d["decision"]) for d in lines] == [
        ("static/alpha:1b", 200, "owner"), ("static/beta:1b", 200, "owner"),
        ("static/beta:1b", 200, "owner"), ("static/alpha:1b", 200, "owner")]


async def test_two_namespaces_serving_one_name_are_told_apart(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    one = await make_rig(StandinOllama(tokens=3))
    two = await make_rig(StandinOllama(tokens=3))
    router, _ = await make_router([f"team-a/standin:1b={one.url}",
                                   f"team-b/standin:1b={two.url}"])
    client = ollama.AsyncClient(host=router.url)
    with pytest.raises(ollama.ResponseError) as ambiguous:
        await client.chat(model="standin:1b", messages=[{"role": "user", "content": "x"}])
    assert ambiguous.value.status_code == 400
    assert "team-a/standin:1b, team-b/standin:1b" in ambiguous.value.error
    await client.chat(model="team-b/standin:1b", messages=[{"role": "user", "content": "x"}])
    assert not one.standin.generations
    # The replica is asked for the name it serves.
    assert [g.body["model"] for g in two.standin.generations] == ["standin:1b"]


async def test_unknown_or_missing_model_and_oversize_bodies_in_each_apis_shape(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    alpha, beta = await _two_models(make_rig)
    router, _ = await make_router([f"alpha:1b={alpha.url}", f"beta:1b={beta.url}"],
                                  max_body_bytes=4096,
                                  bounds=replace(CONFIG.bounds, max_messages=10))
    client = ollama.AsyncClient(host=router.url)
    with pytest.raises(ollama.ResponseError) as missing:
        await client.chat(model="gamma:1b", messages=[{"role": "user", "content": "x"}])
    assert missing.value.status_code == 404
    assert missing.value.error == ("model 'gamma:1b' is not served here; "
                                   "models: alpha:1b, beta:1b")
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused",
                                  max_retries=0) as oai:
        with pytest.raises(openai.NotFoundError) as oai_missing:
            await oai.completions.create(model="gamma:1b", prompt="x")
        assert "models: alpha:1b, beta:1b" in oai_missing.value.message
        with pytest.raises(openai.APIStatusError) as big:
            await oai.completions.create(model="alpha:1b", prompt="x" * 5000)
        assert big.value.status_code == 413 and "--max-body-bytes" in big.value.message
    async with aiohttp.ClientSession() as http:
        for body, status, said in (
            ({"messages": []}, 400, "model: missing or not a string"),
            ({"model": 7}, 400, "model: missing or not a string"),
            ([1], 400, "not a JSON object"),
            ({"model": "alpha:1b", "messages": [{}] * 11}, 413, "--max-messages"),
        ):
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                doc = await resp.json()
                assert (resp.status, said in doc["error"]["message"]) == (status, True), doc
        async with http.post(router.url + "/api/chat", data=b"{not json") as resp:
            assert (resp.status, await resp.json()) == (400, {"error": "the body is not JSON"})
    assert not alpha.standin.generations and not beta.standin.generations


# ---- cancellation ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_a_caller_who_leaves_the_router_is_seen_by_the_gateway_at_once(
        make_rig: RigFactory, make_router: RouterFactory, stream: bool) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=400))
    router, log = await make_router([f"standin:1b={rig.url}"])
    client = await RawClient.send(router.port, "/api/chat", {
        "model": "standin:1b", "messages": [{"role": "user", "content": "x"}], "stream": stream})
    if stream:
        await client.reader.readline()  # the status line: the stream has started
    await wait_until(lambda: bool(rig.standin.generations)
                     and rig.standin.generations[0].tokens >= 3, timeout=10)
    left = time.monotonic()
    client.close()
    gen = rig.standin.generations[0]
    stopped = await wait_until(lambda: gen.stopped is not None, timeout=5)
    print(f"through the router (stream={stream}): upstream stopped "
          f"{1000 * (stopped - left):.1f} ms after the caller left")
    assert gen.stop_reason == "client_gone" and gen.tokens < 400
    await wait_until(lambda: len(rig.log) == 1 and len(log) == 1)
    assert rig.log_docs()[0]["outcome"] == "cancelled_disconnect"
    assert rig.gateway.gateway.board.snapshot().busy == 0


# ---- sessions ------------------------------------------------------------------------------


def trust_the_router(rig: Rig, namespace: str = "static") -> Rig:
    """The gateway given the routers' public key and its identity, as the
    operator renders them (--router-key, --pod-namespace, --pod-name); a
    static replica's name is its URL, known once the rig listens."""
    rig.gateway.gateway.pipeline.marks = RouterMarks(KEY.public_key(), namespace, rig.url)
    return rig


async def _replicas_of_one_model(make_rig: RigFactory, n: int, **standin: Any) -> list[Rig]:
    return [trust_the_router(await make_rig(StandinOllama(**standin))) for _ in range(n)]


async def test_a_session_stays_with_its_owner_turn_after_turn(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    rigs = await _replicas_of_one_model(make_rig, 3, tokens=3)
    router, _ = await make_router(["standin:1b=" + ",".join(_replica(r) for r in rigs)])
    await router.router.poll()
    names = ["static/" + r.url for r in rigs]  # each replica's id: namespace/URL
    # The owners the router must pick: the same sessions arriving in the same
    # order at a table of its own (rendezvous with bounded loads, router/owners.py).
    expected = Owners()
    async with aiohttp.ClientSession() as http:
        for session in ("s-1", "s-2", "s-3", "s-4"):
            key = session_key(session, {}, SALT)
            assert key is not None
            owner = expected.owner("static/standin:1b", key, names, 0.0)
            for turn in range(3):
                body = {"model": "standin:1b", "stream": False,
                        "messages": [{"role": "user", "content": f"turn {turn}"}]}
                async with http.post(router.url + "/api/chat", json=body,
                                     headers={"X-LocalModel-Session": session}) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-LocalModel-Replica"] == owner
                    assert resp.headers[ROUTE_HEADER] == "owner"
        # Without the header: the conversation's opening is its key.
        seen = set()
        history = [{"role": "system", "content": "terse"}, {"role": "user", "content": "q1"}]
        for turn in range(4):
            async with http.post(router.url + "/v1/chat/completions",
                                 json={"model": "standin:1b", "messages": history}) as resp:
                seen.add(resp.headers["X-LocalModel-Replica"])
                answer = (await resp.json())["choices"][0]["message"]["content"]
            history += [{"role": "assistant", "content": answer},
                        {"role": "user", "content": f"q{turn + 2}"}]
        assert len(seen) == 1


async def test_a_busy_owner_spills_and_the_decision_carries_both_estimates(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    rigs = await _replicas_of_one_model(make_rig, 2, tokens=40, token_delay=0.05)
    router, log = await make_router(["standin:1b=" + ",".join(_replica(r) for r in rigs)])
    by_url = {"static/" + r.url: r for r in rigs}  # by the replica's id
    # Answers of 30 tokens at 0.05 s: a request takes about 1.5 s, so a queue of one
    # behind a running answer is a wait past the spill margin (2x the cost elsewhere + 1 s).
    turn = {"model": "standin:1b", "stream": False, "options": {"num_predict": 30},
            "messages": [{"role": "user", "content": "hello there " * 20}]}
    headers = {"X-LocalModel-Session": "spill-me"}
    async with aiohttp.ClientSession() as http:
        async with http.post(router.url + "/api/chat", json=turn, headers=headers) as resp:
            owner = resp.headers["X-LocalModel-Replica"]
            assert resp.headers[ROUTE_HEADER] == "owner"
        other = next(u for u in by_url if u != owner)
        # Each replica has served once (its /speed now knows its times).
        async with http.post(by_url[other].url + "/api/chat",
                             json={**turn, "model": "standin:1b"}):
            pass
        # The owner's one slot is taken by a long answer, and one more waits.
        busy = [await RawClient.send(int(owner.rsplit(":", 1)[1]), "/api/generate",
                                     {"prompt": "long", "stream": False,
                                      "options": {"num_predict": 200}}) for _ in range(2)]
        await wait_until(lambda: by_url[owner].gateway.gateway.board.snapshot().busy == 1
                         and by_url[owner].gateway.gateway.board.snapshot().queued == 1,
                         timeout=10)
        await router.router.poll()
        async with http.post(router.url + "/api/chat", json=turn, headers=headers) as resp:
            assert resp.status == 200
            route = resp.headers[ROUTE_HEADER]
            assert resp.headers["X-LocalModel-Replica"] == other
        for client in busy:
            client.close()
    assert route.startswith("spilled; owner_wait_s="), route
    fields = dict(part.split("=") for part in route.split("; ")[1:])
    owner_wait, reread = float(fields["owner_wait_s"]), float(fields["reread_s"])
    other_wait = float(fields["wait_s"])
    assert owner_wait > 2 * (other_wait + reread) + 1  # the reason it spilled, all estimated
    doc = json.loads(log[-1])
    assert (doc["decision"], doc["owner"], doc["replica"]) == ("spilled", owner, other)
    assert doc["owner_wait_s"] == pytest.approx(owner_wait, abs=1e-3)
    assert doc["reread_s"] == pytest.approx(reread, abs=1e-3)
    metrics = router.router.metrics
    assert metrics.decisions.value(("spilled",)) == 1
    assert metrics.decisions.value(("owner",)) == 1
    async with aiohttp.ClientSession() as http, http.get(router.admin_url + "/metrics") as resp:
        text = await resp.text()
    assert 'localmodel_router_decisions_total{decision="spilled"} 1' in text
    assert "localmodel_router_owned_sessions 1" in text  # one session, however it was routed
    # Only the owner was told it owns the session: a spill tells nothing.
    key = session_key("spill-me", {}, SALT)
    assert by_url[owner].gateway.gateway.pipeline.owned.listed() == [key]
    assert by_url[other].gateway.gateway.pipeline.owned.listed() == []
    # Each replica's ledger keeps the decision it was sent, estimates and all.
    routed = {}
    async with aiohttp.ClientSession() as http:
        for url, rig in by_url.items():
            async with http.get(rig.admin_url + "/ledger") as resp:
                routed[url] = [e["routed"] for e in (await resp.json())["entries"]
                               if e["session"] == "spill-me"]
    assert routed[owner] == ["owner"]
    assert routed[other] == [route]


async def test_a_second_router_finds_the_owner_the_first_chose_from_the_gateways(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    """Router A places two sessions that rank the same replica first: the
    second goes down its ranking (the cap). Router B meets that session first:
    on its own it would place it first in the ranking; from the gateways'
    /slots it finds A's choice."""
    rigs = await _replicas_of_one_model(make_rig, 2, tokens=3)
    replicas = ["standin:1b=" + ",".join(_replica(r) for r in rigs)]
    names = ["static/" + r.url for r in rigs]
    first = session_key("pair-0", {}, SALT)
    assert first is not None

    def top_of(session: str) -> str:  # as router/owners.py ranks a session of this model
        return ranking(f"static/standin:1b\0{session_key(session, {}, SALT)}", names)[0]

    top = top_of("pair-0")
    pair = ["pair-0", next(f"pair-{i}" for i in range(1, 500) if top_of(f"pair-{i}") == top)]
    a, _ = await make_router(replicas)
    b, _ = await make_router(replicas)
    await a.router.poll()

    async def turn(router: RunningRouter, session: str) -> str:
        body = {"model": "standin:1b", "stream": False,
                "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http, http.post(
                router.url + "/api/chat", json=body,
                headers={"X-LocalModel-Session": session}) as resp:
            assert resp.status == 200 and resp.headers[ROUTE_HEADER] == "owner"
            return resp.headers["X-LocalModel-Replica"]

    placed = [await turn(a, s) for s in pair]
    assert placed[0] == top and placed[1] != top  # the second went down its ranking
    by_url = {"static/" + r.url: r for r in rigs}
    assert by_url[top].gateway.gateway.pipeline.owned.listed() == [first]
    assert by_url[placed[1]].gateway.gateway.pipeline.owned.listed() == [
        session_key(pair[1], {}, SALT)]
    await b.router.poll()
    assert await turn(b, pair[1]) == placed[1]  # from the gateways' lists
    assert await turn(b, pair[0]) == placed[0]
    # What B would have done on its own: its first choice.
    alone = Owners().owner("static/standin:1b", session_key(pair[1], {}, SALT) or "", names, 0.0)
    assert alone == top


# ---- hostile replicas ---------------------------------------------------------------------

HOSTILE: dict[str, tuple[int, bytes]] = {
    "nan": (200, b'{"total": NaN}'),
    "deep": (200, b"[" * 50_000),
    "huge": (200, b'{"x": "' + b"a" * 200_000 + b'"}'),
    "negative": (200, b'{"total": 1, "busy": -5, "queued": {"foreground": 0, '
                      b'"background": 0}}'),
    "not utf-8": (200, b"\xff\xfe\xfd"),
    "error": (500, b"boom"),
}


async def test_hostile_slots_and_speed_answers_leave_the_state_unknown(
        make_rig: RigFactory, make_router: RouterFactory) -> None:
    """A replica whose /slots and /speed answer badly (a stand-in web app: these
    answers are what no real gateway sends) is read as unknown; its sessions
    stay on their owner and the bad reads are counted."""
    good = await make_rig(StandinOllama(tokens=2))
    apps: list[web.AppRunner] = []
    urls = []
    for status, body in HOSTILE.values():
        app = web.Application()

        async def answer(request: web.Request, status: int = status,
                         body: bytes = body) -> web.Response:
            return web.Response(status=status, body=body)

        app.router.add_get("/slots", answer)
        app.router.add_get("/speed", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        apps.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        replicas = [f"{u}|{u}" for u in urls]
        router, _ = await make_router([f"standin:1b={_replica(good)}",
                                       "bad:1b=" + ",".join(replicas)])
        await router.router.poll()
        watch = router.router.watch
        for url in urls:
            state = watch.state("static/" + url)
            assert (state.wait_s, state.prefill_tps) == (None, None), url
        # Each poll (the one at start, perhaps, and this one) reads the good replica once.
        def reads(what: str, result: str) -> float:  # over every replica
            return sum(v for k, v in watch.reads.values.items() if k[2:] == (what, result))

        polls = watch.reads.value(("static", good.url, "slots", "ok"))
        assert polls >= 1
        assert reads("slots", "bad") == 5 * polls
        assert reads("speed", "bad") == 5 * polls
        assert reads("slots", "status_5xx") == polls
        assert watch.state("static/" + good.url).wait_s == 0.0
        client = ollama.AsyncClient(host=router.url)
        answer = await client.chat(model="standin:1b", messages=[{"role": "user", "content": "x"}])
        assert answer.done
    finally:
        for runner in apps:
            await runner.cleanup()
