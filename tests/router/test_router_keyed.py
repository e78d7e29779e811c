"""Keys at the front door, the pure parts: which LocalModels ask for keys
(router/cluster.py), `;keys` in --replicas (router/static.py), errors that
name no keyed model (router/table.py), the cache of gateways' answers and the
checks a listing starts (router/keyed.py), and the key check's proof
(gateway_contract). Through the router with real gateways:
tests/router/test_router_keys.py."""

from __future__ import annotations

import hashlib
import secrets

import pytest

from localmodel.gateway_contract.keys import bearer, key_proof, parse_key_check, proof_matches
from localmodel.router.cluster import ModelEntry, Unreadable, keep_model, route_table
from localmodel.router.keyed import Answers, to_check
from localmodel.router.static import BadReplicas, parse_replicas
from localmodel.router.table import (
    Ambiguous,
    ModelRoute,
    NotFound,
    Replica,
    listed_names,
    lookup,
    open_models,
)
from tests.builders import MakeLocalModel
from tests.harness.clock import Clock

pytestmark = pytest.mark.unit

R = (Replica("static", "r0", "http://r0", None),)


def test_a_localmodel_with_auth_is_kept_as_keyed_and_its_secret_is_not_kept() -> None:
    ref = {"keysSecretRef": {"name": "team-a-keys", "key": "keys.json"}}
    body = MakeLocalModel("chat", "team-a").spec(model="chat:1b", gateway={"auth": ref}).manifest()
    entry = keep_model(body)
    assert entry == ModelEntry("team-a", "chat", "chat:1b", True, keyed=True)
    assert "team-a-keys" not in repr(entry)
    assert keep_model(MakeLocalModel("open", "team-a").spec(model="o:1b").manifest()).keyed is False
    table, _ = route_table([entry], [])
    assert table[0].keyed is True


def test_an_auth_that_is_not_an_object_is_unreadable_naming_the_field() -> None:
    body = MakeLocalModel("chat", "team-a").spec(model="chat:1b").manifest()
    body["spec"]["gateway"] = {"auth": "yes"}
    with pytest.raises(Unreadable, match=r"spec\.gateway\.auth: not an object"):
        keep_model(body)


def test_keys_after_the_urls_mark_a_static_model_keyed() -> None:
    table = parse_replicas(["team-a/chat:1b=http://a:8080|http://a:8090;keys",
                            "open:1b=http://o:8080"])
    assert [(r.qualified, r.keyed) for r in table] == [("team-a/chat:1b", True),
                                                       ("static/open:1b", False)]
    assert table[0].replicas[0].admin_url == "http://a:8090"
    with pytest.raises(BadReplicas, match="after ';' only 'keys' may follow the URLs"):
        parse_replicas(["chat:1b=http://a:8080;key"])


def test_errors_that_list_models_name_no_keyed_one() -> None:
    table = (ModelRoute("team-a", "chat:1b", R, keyed=True),
             ModelRoute("team-b", "chat:1b", R, keyed=True),
             ModelRoute("team-a", "secret:1b", R, keyed=True),
             ModelRoute("team-c", "open:1b", R))
    missing = lookup(table, "nope")
    assert isinstance(missing, NotFound) and missing.known == ("open:1b",)
    assert "secret" not in missing.message and "chat" not in missing.message.split(";")[1]
    ambiguous = lookup(table, "chat:1b")
    assert isinstance(ambiguous, Ambiguous) and ambiguous.choices == ()
    assert "team-" not in ambiguous.message and "namespace/name" in ambiguous.message
    assert open_models(table) == {"team-c/open:1b"}


def test_a_listing_of_some_models_keeps_the_spelling_the_whole_table_gives() -> None:
    table = (ModelRoute("team-a", "chat:1b", R, keyed=True), ModelRoute("team-c", "chat:1b", R))
    # The open model shares its name with a keyed one: listed as a request must spell it.
    assert listed_names(table, open_models(table)) == ("team-c/chat:1b",)
    assert listed_names(table) == ("team-a/chat:1b", "team-c/chat:1b")


def test_answers_expire_after_their_ttl_and_are_bounded_oldest_first() -> None:
    clock = Clock(100.0)
    answers = Answers(clock, ttl=10.0, limit=3)
    answers.put(b"k1", "a/m", True)
    answers.put(b"k2", "a/m", False)
    assert (answers.get(b"k1", "a/m"), answers.get(b"k2", "a/m")) == (True, False)
    assert answers.get(b"k1", "b/m") is None  # per model
    clock.now += 10.0
    assert answers.get(b"k1", "a/m") is None  # expired: asked again
    for i in range(5):
        answers.put(b"k%d" % i, "a/m", True)
    assert len(answers) == 3
    assert [answers.get(b"k%d" % i, "a/m") for i in range(5)] == [None, None, True, True, True]


def test_a_listing_asks_only_keyed_models_not_yet_known_and_at_most_its_limit() -> None:
    table = (ModelRoute("o", "open", R),
             ModelRoute("a", "yes", R, keyed=True),
             ModelRoute("a", "no", R, keyed=True),
             ModelRoute("a", "down", (), keyed=True),  # no Ready replica: nothing to ask
             *(ModelRoute("b", f"m{i}", R, keyed=True) for i in range(5)))
    known = {"a/yes": True, "a/no": False}
    accepted, ask = to_check(table, known.get, limit=3)
    assert accepted == ("a/yes",)
    assert [r.qualified for r in ask] == ["b/m0", "b/m1", "b/m2"]


def test_a_proof_matches_only_its_key_and_its_nonce() -> None:
    key = "lmk-" + secrets.token_hex(16)
    digests = [hashlib.sha256(f"other-{i}".encode()).digest() for i in range(50)]
    digests.insert(17, hashlib.sha256(key.encode()).digest())
    nonce = secrets.token_hex(16)
    proof = key_proof(hashlib.sha256(key.encode()).digest(), nonce)
    parsed = parse_key_check(nonce, proof)
    assert parsed is not None
    assert proof_matches(digests, *parsed) is True
    assert proof_matches(digests[:17] + digests[18:], *parsed) is False
    assert proof_matches(digests, secrets.token_hex(16), parsed[1]) is False  # another nonce
    assert key not in proof and hashlib.sha256(key.encode()).hexdigest() not in proof
    assert key_proof(digests[17], secrets.token_hex(16)) != proof  # a new nonce, a new proof


@pytest.mark.parametrize(("nonce", "proof"), [
    (None, "0" * 64), ("0" * 32, None), ("0" * 31, "0" * 64), ("0" * 32, "0" * 65),
    ("A" * 32, "0" * 64), ("0" * 32, "g" * 64), ("0" * 32 + "\n", "0" * 64),
])
def test_a_malformed_key_check_is_refused(nonce: str | None, proof: str | None) -> None:
    assert parse_key_check(nonce, proof) is None


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer", None),
    (None, None), ("Bearer " + "x" * 600, None),
])
def test_the_bearer_token_is_read_as_the_gateway_reads_it(header: str | None,
                                                          token: str | None) -> None:
    assert bearer(header) == token
