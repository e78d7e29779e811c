"""The router's pure parts: the route table's lookup, `--replicas`, session
keys and their owners (rendezvous hashing), the spill decision, the replicas'
/slots and /speed answers read at the edge, and the accounting read from an
answer's tail."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.gateway_contract.headers import SESSION_KEY_PATTERN, owned_key
from localmodel.router.account import SessionBook, tokens_from_tail
from localmodel.router.answers import MAX_OWNED, BadDocument, slots_from, speed_from
from localmodel.router.decide import ReplicaState, decide, wait_seconds
from localmodel.router.session import opening, owner, prompt_tokens, ranking, session_key
from localmodel.router.static import BadReplicas, parse_replicas
from localmodel.router.table import (
    Ambiguous,
    Found,
    ModelRoute,
    NotFound,
    Replica,
    listed_names,
    lookup,
)

pytestmark = pytest.mark.unit


def _route(namespace: str, name: str, *urls: str) -> ModelRoute:
    return ModelRoute(namespace, name, tuple(Replica(namespace, u, u, None) for u in urls))


TABLE = (_route("a", "gemma3:270m", "http://a1:8080"), _route("b", "gemma3:270m", "http://b1"),
         _route("a", "qwen3:0.6b", "http://q1"))


# ---- the table ----------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "want"), [
    ("qwen3:0.6b", ("found", "a/qwen3:0.6b")),
    ("a/qwen3:0.6b", ("found", "a/qwen3:0.6b")),
    ("b/gemma3:270m", ("found", "b/gemma3:270m")),
    ("gemma3:270m", ("ambiguous", "a/gemma3:270m, b/gemma3:270m")),
    ("c/gemma3:270m", ("missing", "a/gemma3:270m, b/gemma3:270m, qwen3:0.6b")),
    ("llama3", ("missing", "a/gemma3:270m, b/gemma3:270m, qwen3:0.6b")),
])
def test_lookup_by_bare_or_qualified_name(asked: str, want: tuple[str, str]) -> None:
    found = lookup(TABLE, asked)
    if isinstance(found, Found):
        assert want == ("found", found.route.qualified)
    elif isinstance(found, Ambiguous):
        assert want == ("ambiguous", ", ".join(found.choices))
        assert "a/gemma3:270m" in found.message and "more than one namespace" in found.message
    else:
        assert isinstance(found, NotFound)
        assert want == ("missing", ", ".join(found.known))
        assert repr(asked) in found.message


def test_listing_names_each_model_as_a_request_may_spell_it() -> None:
    assert listed_names(TABLE) == ("a/gemma3:270m", "b/gemma3:270m", "qwen3:0.6b")


# ---- --replicas ---------------------------------------------------------------------


def test_static_replicas_with_and_without_admin_urls() -> None:
    table = parse_replicas(["gemma=http://10.0.0.7:8080|http://10.0.0.7:8090,http://h:1/",
                            "team/qwen=https://q"])
    assert table == (
        ModelRoute("static", "gemma", (Replica("static", "http://10.0.0.7:8080",
                                               "http://10.0.0.7:8080", "http://10.0.0.7:8090"),
                                       Replica("static", "http://h:1", "http://h:1", None))),
        ModelRoute("team", "qwen", (Replica("team", "https://q", "https://q", None),)),
    )


@pytest.mark.parametrize(("values", "reason"), [
    (["gemma"], "expected MODEL=URL[,URL...]"),
    (["=http://a"], "expected MODEL=URL[,URL...]"),
    (["gemma="], "an empty replica URL"),
    (["gemma=http://a,,http://b"], "an empty replica URL"),
    (["gemma=ftp://a"], "URL 'ftp://a' is not an http(s) URL with a host"),
    (["gemma=http://a/v1"], "must be a base URL"),
    (["gemma=http://a:99999"], "has a bad port"),
    (["gemma=http://a|nope"], "admin URL 'nope' is not an http(s) URL"),
    (["gemma=http://a,http://a"], "a replica URL is given twice"),
    (["/gemma=http://a"], "'/gemma' is not a model name"),
    (["team/=http://a"], "'team/' is not a model name"),
    (["gemma=http://a", "static/gemma=http://b"], "model static/gemma is given more than once"),
])
def test_bad_static_replicas_name_the_flag_the_value_and_the_reason(
        values: list[str], reason: str) -> None:
    with pytest.raises(BadReplicas) as caught:
        parse_replicas(values)
    assert str(caught.value).startswith(f"--replicas {values[-1]!r}: ")
    assert reason in str(caught.value)


# ---- sessions -------------------------------------------------------------------------


def _chat(*turns: str, system: str = "You are terse.") -> dict[str, object]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def test_a_conversations_fingerprint_survives_its_next_turns() -> None:
    first = session_key(None, _chat("What is a CPU?"))
    later = session_key(None, _chat("What  is a\nCPU?", "A processor.", "And a GPU?"))
    parts = session_key(None, {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": "What is a CPU?"}]})
    assert first is not None and first.startswith("f:")
    assert first == later == parts
    assert session_key(None, _chat("What is a GPU?")) != first
    assert session_key(None, _chat("What is a CPU?", system="Be verbose.")) != first


def test_the_session_header_wins_over_the_fingerprint() -> None:
    assert session_key("s-1", _chat("a")) == session_key(" s-1 ", _chat("b"))
    assert session_key("s-1", _chat("a")) != session_key("s-2", _chat("a"))
    assert session_key("", {"messages": []}) is None


@pytest.mark.parametrize(("body", "text"), [
    ({"prompt": "Once upon a time"}, "prompt:Once upon a time"),
    ({"prompt": "x", "system": "s"}, "system:s\nprompt:x"),
    ({"prompt": ["a b", "c"]}, "prompt:a b"),
    ({"prompt": "a" * 5000}, "prompt:" + "a" * 512),
    ({"messages": "not a list"}, None),
    ({"messages": [1, {"role": "tool"}]}, None),
    ({}, None),
])
def test_the_opening_of_a_prompt(body: dict[str, object], text: str | None) -> None:
    assert opening(body) == text


NAMES = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8, unique=True)
KEYS = st.lists(st.text(max_size=20), min_size=1, max_size=60, unique=True)


@settings(max_examples=200, deadline=None)
@given(names=NAMES, joiner=st.text(min_size=1, max_size=12), keys=KEYS)
def test_a_joining_replica_takes_only_the_sessions_it_now_owns(
        names: list[str], joiner: str, keys: list[str]) -> None:
    if joiner in names:
        return
    for key in keys:
        before, after = owner(key, names), owner(key, [*names, joiner])
        assert after in (before, joiner)  # moved only to the newcomer


@settings(max_examples=200, deadline=None)
@given(names=NAMES.filter(lambda n: len(n) > 1), keys=KEYS, data=st.data())
def test_a_leaving_replica_moves_only_its_own_sessions(
        names: list[str], keys: list[str], data: st.DataObject) -> None:
    leaver = data.draw(st.sampled_from(names))
    rest = [n for n in names if n != leaver]
    for key in keys:
        before = owner(key, names)
        after = owner(key, rest)
        if before != leaver:
            assert after == before
        else:  # to the next in its ranking: every router agrees where it goes
            assert after == ranking(key, names)[1]


@settings(max_examples=100, deadline=None)
@given(names=NAMES, key=st.text(max_size=20), data=st.data())
def test_every_router_agrees_whatever_order_it_lists_the_replicas(
        names: list[str], key: str, data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(names))
    assert ranking(key, names) == ranking(key, shuffled)


def test_sessions_spread_over_the_replicas() -> None:
    names = ["r1", "r2", "r3"]
    counts = {n: 0 for n in names}
    for i in range(3000):
        counts[owner(f"session-{i}", names)] += 1
    assert all(800 < c < 1200 for c in counts.values()), counts


# ---- the decision -------------------------------------------------------------------------


@pytest.mark.parametrize(("total", "occupied", "mean", "want"), [
    (1, 0, None, 0.0), (2, 1, 5.0, 0.0), (1, 1, 4.0, 2.0), (1, 3, 4.0, 10.0), (2, 3, 4.0, 3.0),
    (1, 1, None, None),
])
def test_wait_for_a_slot(total: int, occupied: int, mean: float | None,
                         want: float | None) -> None:
    assert wait_seconds(total, occupied, mean) == want


IDLE = ReplicaState(wait_s=0.0, prefill_tps=100.0)


@pytest.mark.parametrize(("case", "states", "held", "want"), [
    ("owner idle", {"o": IDLE, "x": IDLE}, {"o": 1000}, ("o", "owner", 0.0, 10.0)),
    # waiting 30 s at the owner beats re-reading 1000 tokens at 100/s elsewhere (10 s)
    ("owner busy, cheap re-read", {"o": ReplicaState(30.0, 100.0), "x": IDLE}, {"o": 1000},
     ("x", "spilled", 30.0, 10.0)),
    ("owner busy, dear re-read", {"o": ReplicaState(5.0, 100.0), "x": IDLE}, {"o": 1000},
     ("o", "owner", 5.0, 10.0)),
    ("other holds part", {"o": ReplicaState(6.0, 100.0), "x": IDLE}, {"o": 1000, "x": 800},
     ("x", "spilled", 6.0, 2.0)),
    # A spill must win by a clear margin: more than twice the cost elsewhere, plus 1 s.
    ("owner's wait just over the re-read", {"o": ReplicaState(15.0, 100.0), "x": IDLE},
     {"o": 1000}, ("o", "owner", 15.0, 10.0)),
    ("owner's wait twice the re-read", {"o": ReplicaState(20.0, 100.0), "x": IDLE},
     {"o": 1000}, ("o", "owner", 20.0, 10.0)),
    ("owner's wait twice the re-read and 1 s", {"o": ReplicaState(21.0, 100.0), "x": IDLE},
     {"o": 1000}, ("o", "owner", 21.0, 10.0)),
    ("owner's wait past the margin", {"o": ReplicaState(21.5, 100.0), "x": IDLE},
     {"o": 1000}, ("x", "spilled", 21.5, 10.0)),
    ("the other's wait counts as cost", {"o": ReplicaState(20.0, 100.0),
                                         "x": ReplicaState(10.0, 100.0)},
     {"o": 1000, "x": 1000}, ("o", "owner", 20.0, 0.0)),
    ("other busy too", {"o": ReplicaState(30.0, 100.0), "x": ReplicaState(25.0, 100.0)},
     {"o": 1000}, ("o", "owner", 30.0, 10.0)),
    ("owner unknown", {"x": IDLE}, {"o": 1000}, ("o", "owner", None, 10.0)),
    ("other's speed unknown", {"o": ReplicaState(30.0, 100.0), "x": ReplicaState(0.0, None)},
     {"o": 1000}, ("o", "owner", 30.0, None)),
    ("new session, owner busy", {"o": ReplicaState(3.0, None), "x": ReplicaState(0.0, None)},
     {}, ("x", "spilled", 3.0, 0.0)),
    ("new session, owner nearly free", {"o": ReplicaState(1.0, None),
                                        "x": ReplicaState(0.0, None)},
     {}, ("o", "owner", 1.0, 0.0)),
    ("equal costs stay home", {"o": ReplicaState(10.0, 100.0), "x": IDLE}, {"o": 1000},
     ("o", "owner", 10.0, 10.0)),
])
def test_the_spill_decision(case: str, states: dict[str, ReplicaState],
                            held: dict[str, int], want: tuple[object, ...]) -> None:
    d = decide(["o", "x"], states, held)
    assert (d.replica, d.kind, d.owner_wait_s, d.reread_s) == want, case
    if d.kind == "spilled":
        assert d.header.startswith(f"spilled; owner_wait_s={d.owner_wait_s:.3f}; "
                                   f"reread_s={d.reread_s:.3f}")
    else:
        assert d.header == "owner"


def test_an_unseen_sessions_prompt_counts_as_its_history() -> None:
    states = {"o": ReplicaState(3.0, None), "x": ReplicaState(0.0, 100.0)}
    # 500 prompt tokens the owner would read again when the session comes back: 5 s
    d = decide(["o", "x"], states, {}, prompt_tokens=500)
    assert (d.kind, d.reread_s) == ("owner", 5.0)
    assert decide(["o", "x"], states, {"o": 600}, prompt_tokens=500).reread_s == 6.0
    assert decide(["o", "x"], states, {}, prompt_tokens=100).kind == "owner"  # 3 !> 2*1+1
    assert decide(["o", "x"], states, {}, prompt_tokens=50).kind == "spilled"
    # The margin is the caller's to set: without it, any longer wait spills.
    assert decide(["o", "x"], states, {}, 100, factor=1.0, margin_s=0.0).kind == "spilled"


def test_a_prompts_tokens_are_estimated_from_its_text() -> None:
    assert prompt_tokens(_chat("a" * 40)) == (len("You are terse.") + 40) // 4
    assert prompt_tokens({"prompt": "b" * 10, "system": "c" * 10}) == 5
    assert prompt_tokens({"messages": "x"}) == 0


def test_the_cheapest_other_replica_is_chosen() -> None:
    states = {"o": ReplicaState(60.0, 100.0), "x": ReplicaState(20.0, 100.0),
              "y": ReplicaState(0.0, 100.0)}
    d = decide(["o", "x", "y"], states, {"o": 1000, "x": 1000})
    # y: no wait, 10 s of re-read; x: holds it all, but 20 s of wait
    assert (d.replica, d.reread_s, d.other_wait_s) == ("y", 10.0, 0.0)
    states["y"] = ReplicaState(0.0, 40.0)  # 25 s of re-read: x (20 s of wait) is cheaper
    assert decide(["o", "x", "y"], states, {"o": 1000, "x": 1000}).replica == "x"


# ---- the replicas' answers ----------------------------------------------------------------

SLOTS = {"model": "m", "engine": "llama-server", "total": 2, "busy": 2, "free": 0,
         "queued": {"foreground": 3, "background": 0}, "queue_limit": 16}


def test_slots_answer() -> None:
    s = slots_from(json.dumps(SLOTS).encode())
    assert (s.total, s.occupied, s.owned) == (2, 5, frozenset())  # an older gateway: none
    keys = ["h:" + "0" * 24, "f:0123456789abcdef01234567"]
    s = slots_from(json.dumps({**SLOTS, "owned_sessions": keys}).encode())
    assert s.owned == frozenset(keys)


KEY = "h:" + "a" * 24


@pytest.mark.parametrize(("owned", "reason"), [
    ("h:" + "a" * 24, "not a list"),
    ({"h": 1}, "not a list"),
    ([KEY] * (MAX_OWNED + 1), "not a list of at most"),
    ([KEY, 7], "not a session key"),
    ([KEY, "H:" + "A" * 24], "not a session key"),
    (["h:" + "a" * 23], "not a session key"),
    (["h:" + "a" * 24 + "\n"], "not a session key"),
    (["x:" + "a" * 24], "not a session key"),
    (["h:" + "a" * 2000], "not a session key"),
])
def test_hostile_owned_sessions_are_one_error(owned: object, reason: str) -> None:
    with pytest.raises(BadDocument, match=reason):
        slots_from(json.dumps({**SLOTS, "owned_sessions": owned}).encode())


def test_every_session_key_is_one_a_gateway_lists() -> None:
    """The router's keys (router/session.py) and the pattern the gateway and
    the router check them with (gateway_contract/headers.py) are one format."""
    for header, body in (("s-1", {}), (" x " * 200, {}), (None, {"prompt": "hello"}),
                         (None, {"messages": [{"role": "user", "content": "q"}]})):
        key = session_key(header, body)
        assert key is not None and re.fullmatch(SESSION_KEY_PATTERN, key), key
        assert owned_key(key) == key


@pytest.mark.parametrize(("raw", "reason"), [
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000, "longer than"),
    (b"[" * 5000 + b"]" * 5000, "not JSON"),
    (b"[[]]", "not a /slots document"),
    (json.dumps({**SLOTS, "total": 0}).encode(), "total is 0"),
    (json.dumps({**SLOTS, "total": 10**400}).encode(), "total is int"),
    (json.dumps({**SLOTS, "busy": -1}).encode(), "busy is -1"),
    (json.dumps({**SLOTS, "busy": 1.5}).encode(), "busy is float"),
    (json.dumps({**SLOTS, "queued": 3}).encode(), "queued is not an object"),
    (json.dumps({**SLOTS, "queued": {"foreground": True}}).encode(), "queued.foreground"),
    (b'{"total": NaN}', "not a number"),
    (json.dumps({**SLOTS, "total": "x"}).encode().replace(b'"x"', b"1e999"), "total is float"),
])
def test_hostile_slots_answers_are_one_error(raw: bytes, reason: str) -> None:
    with pytest.raises(BadDocument, match=reason.replace("(", r"\(")):
        slots_from(raw)


def _speed(cal: object, **totals: float) -> bytes:
    t = {"requests": 0, "generated_tokens": 0, "decode_seconds": 0, "prompt_tokens": 0,
         "prefill_seconds": 0, **totals}
    return json.dumps({"calibration": cal, "totals": t}).encode()


@pytest.mark.parametrize(("raw", "want"), [
    (_speed({"prefill_tokens_per_second": 250.0}, requests=4, decode_seconds=6,
            prefill_seconds=2), (250.0, 2.0)),
    (_speed(None, requests=2, prompt_tokens=30, prefill_seconds=3, decode_seconds=1),
     (10.0, 2.0)),
    # Traffic that has read enough replaces the calibration's short prompt.
    (_speed({"prefill_tokens_per_second": 250.0}, requests=2, prompt_tokens=300,
            prefill_seconds=3, decode_seconds=1), (100.0, 2.0)),
    (_speed(None), (None, None)),
])
def test_speed_answer(raw: bytes, want: tuple[float | None, float | None]) -> None:
    s = speed_from(raw, 0.0)
    assert (s.prefill_tps, s.mean_request_s) == want


@pytest.mark.parametrize("raw", [
    b"null", b"{}", _speed({"prefill_tokens_per_second": -1.0}),
    _speed({"prefill_tokens_per_second": "fast"}), b'{"totals": {"requests": 1e999}}',
    _speed(None, requests=1.5), b"x" * 70_000,
])
def test_hostile_speed_answers_are_one_error(raw: bytes) -> None:
    with pytest.raises(BadDocument):
        speed_from(raw, 0.0)


# ---- accounting -----------------------------------------------------------------------------


@pytest.mark.parametrize(("tail", "want"), [
    (b'{"id":"x","usage":{"prompt_tokens":40,"completion_tokens":9}}', 49),
    (b'data: {"choices":[]}\n\ndata: {"choices":[],"timings":{"cache_n":30,"prompt_n":10,'
     b'"predicted_n":5}}\n\ndata: [DONE]\n\n', 45),
    (b'{"done":false}\n{"done":true,"prompt_eval_count":12,"eval_count":3}\n', 15),
    (b'partial line "usage": {"prompt_tokens": 4\n{"done":true,"eval_count":3}\n', None),
    (b'{"usage":{"prompt_tokens":-4,"completion_tokens":1}}', None),
    (b'{"usage":{"prompt_tokens":99999999999,"completion_tokens":1}}', None),
    (b"", None),
])
def test_tokens_held_after_an_answer(tail: bytes, want: int | None) -> None:
    assert tokens_from_tail(tail) == want


def test_the_session_book_forgets_the_least_recent() -> None:
    book = SessionBook(limit=2)
    book.record("a", "r1", 10)
    book.record("b", "r1", 20)
    book.record("a", "r2", 30)
    book.record("c", "r1", 40)
    assert (book.held("a"), book.held("b"), book.held("c")) == ({"r1": 10, "r2": 30}, {},
                                                                 {"r1": 40})


# ---- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "said"), [
    (["--replicas", "gemma=ftp://a"],
     "localmodel router: --replicas 'gemma=ftp://a': URL 'ftp://a' is not an http(s) URL"),
    (["--replicas", "gemma=http://a", "--listen", "nowhere"], "localmodel router: --listen: "),
    (["--replicas", "gemma=http://a", "--poll-interval", "0"],
     "localmodel router: --poll-interval: "),
    # No --replicas: the cluster's, and outside a pod with no kubeconfig there is none.
    ([], "localmodel router: the cluster's replicas: in-cluster configuration"),
])
def test_the_command_refuses_bad_flags_before_serving(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from localmodel.router.cli import run_cli

    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)

    assert run_cli(argv) == 2
    assert capsys.readouterr().err.startswith(said)
