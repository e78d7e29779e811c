"""The doorman's decisions without a server (gateway/doorman.py): what each
route answers, what counts as a wish to wake, the message and Retry-After
from its settings, and the settings themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from localmodel.gateway.config import ConfigError, parse_config
from localmodel.gateway.doorman import Doorman, asleep_message
from localmodel.gateway.keys import digest_of
from localmodel.gateway.routes import ROUTES
from localmodel.gateway_contract import client_api as api
from localmodel.gateway_contract import env_name
from localmodel.gateway_contract.headers import ASLEEP, ASLEEP_RETRY_AFTER_S

pytestmark = pytest.mark.unit

KEY = "lmk-doorman-unit-41d2"


def _doorman(*argv: str) -> Doorman:
    return Doorman(parse_config(["--model", "qwen3:4b", *argv], {}), clock=lambda: 100.0)


def _body(response: web.Response) -> object:
    body = response.body
    assert isinstance(body, bytes)
    return json.loads(body)


def test_every_slot_route_is_told_503_in_its_apis_shape_and_counts() -> None:
    doorman = _doorman("--pod-namespace", "ai", "--wake-seconds", "9")
    slot_routes = [r for r in ROUTES if r.uses_slot]
    assert {r.path for r in slot_routes} == {
        api.GENERATE_PATH, api.CHAT_PATH, api.EMBED_PATH,
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
    for route in slot_routes:
        answer = doorman.answer(route, None)
        assert answer.status == 503
        assert (answer.headers["Retry-After"], answer.headers[ASLEEP]) == ("9", "1")
        body = _body(answer)
        assert isinstance(body, dict)
        message = body["error"]["message"] if route.is_openai else body["error"]
        assert message.startswith("ai/qwen3:4b is asleep and waking: it answers here in about 9 s")
    assert doorman.activity() == {"in_flight": 0, "queued": 0, "arrived": 6,
                                  "idle_seconds": 0.0, "closed": True}


def test_listings_are_empty_and_other_metadata_is_told_but_not_counted() -> None:
    doorman = _doorman()
    by_path = {r.path: r for r in ROUTES}
    assert _body(doorman.answer(by_path[api.TAGS_PATH], None)) == {"models": []}
    assert _body(doorman.answer(by_path[api.PS_PATH], None)) == {"models": []}
    assert _body(doorman.answer(by_path["/v1/models"], None)) == {"object": "list", "data": []}
    for path in (api.SHOW_PATH, api.VERSION_PATH):
        assert doorman.answer(by_path[path], None).status == 503
    assert doorman.activity()["arrived"] == 0


def test_without_the_operators_word_the_retry_after_is_a_closed_gateways() -> None:
    doorman = _doorman()
    chat = next(r for r in ROUTES if r.path == api.CHAT_PATH)
    answer = doorman.answer(chat, None)
    assert answer.headers["Retry-After"] == str(ASLEEP_RETRY_AFTER_S)


def test_the_message_names_the_router_only_when_it_is_known() -> None:
    alone = parse_config(["--model", "qwen3:4b", "--pod-namespace", "ai"], {})
    assert asleep_message(alone, 15) == (
        "ai/qwen3:4b is asleep and waking: it answers here in about 15 s")
    routed = parse_config(["--model", "qwen3:4b", "--pod-namespace", "ai"],
                          {env_name("router-url"): "http://localmodel-router.localmodel:8080/"})
    assert asleep_message(routed, 15) == (
        "ai/qwen3:4b is asleep and waking: it answers here in about 15 s; or send through the "
        "router (http://localmodel-router.localmodel:8080, model `ai/qwen3:4b`), which holds "
        "your request until it is awake")


def test_a_refused_key_is_401_and_never_a_wish_to_wake(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"caller": "team-a", "sha256": digest_of(KEY)}]}))
    doorman = _doorman("--keys-file", str(keys))
    chat = next(r for r in ROUTES if r.path == "/v1/chat/completions")
    tags = next(r for r in ROUTES if r.path == api.TAGS_PATH)
    for route in (chat, tags):
        refused = doorman.answer(route, "Bearer lmk-wrong")
        assert refused.status == 401 and "WWW-Authenticate" in refused.headers
        assert doorman.answer(route, None).status == 401
    assert doorman.activity()["arrived"] == 0
    assert doorman.answer(chat, f"Bearer {KEY}").status == 503
    assert doorman.answer(tags, f"Bearer {KEY}").status == 200
    assert doorman.activity()["arrived"] == 1


@pytest.mark.parametrize(("flag", "value"), [
    ("router-url", "localmodel-router:8080"), ("wake-seconds", "0"), ("wake-seconds", "1.5")])
def test_a_bad_doorman_setting_names_its_flag(flag: str, value: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_config([f"--{flag}", value], {})
    assert bad.value.flag == flag
