"""The doorman as a caller meets it: the REAL program (`localmodel gateway
--doorman`, its own process, no engine behind it) answered by the official
`openai` and `ollama` clients. Every slot route is a clear 503 carrying the
model, when it will answer and the router's address, with Retry-After and
X-LocalModel-Asleep; listings are empty; the probes say Ready; each slot
request is a wish to wake in /speed's activity, read by the operator's own
reader (gateway_contract/speed_answer.py); with keys, a refused key gets 401
and never counts, the router's key check answers as the gateway's does, and
a changed keys Secret is taken without a restart; a huge body is never
waited for."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from localmodel.gateway.keys import digest_of
from localmodel.gateway_contract import SPEED_PATH, env_name
from localmodel.gateway_contract.headers import ASLEEP
from localmodel.gateway_contract.keys import (
    KEY_CHECK_PATH,
    KEY_NONCE_HEADER,
    KEY_PROOF_HEADER,
    key_proof,
)
from localmodel.gateway_contract.speed_answer import reading_from_answer
from localmodel.speed import Activity
from tests.harness.processes import free_ports, http_ok, localmodel_process, wait_until

MODEL = "qwen3:4b"
NAMESPACE = "ai"
ROUTER = "http://localmodel-router.localmodel:8080"
WAKE_S = 22
KEY = "lmk-doorman-7f0c2a91e4d6"
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Doorman:
    url: str
    admin: str


@contextmanager
def _doorman(tmp_path: Path, **flags: str) -> Iterator[Doorman]:
    port, admin = free_ports(2)
    env = os.environ | {
        env_name("model"): MODEL,
        env_name("pod-namespace"): NAMESPACE,
        env_name("router-url"): ROUTER,
        env_name("wake-seconds"): str(WAKE_S),
        env_name("listen"): f"127.0.0.1:{port}",
        env_name("admin-listen"): f"127.0.0.1:{admin}",
        **{env_name(name): value for name, value in flags.items()},
    }
    process = localmodel_process("doorman", ["gateway", "--doorman"],
                                 tmp_path / "doorman.log", env=env)
    url = f"http://127.0.0.1:{port}"
    with process.serving("the doorman ready", lambda: http_ok(url + "/readyz"), 60):
        yield Doorman(url, f"http://127.0.0.1:{admin}")


@pytest.fixture
def door(tmp_path: Path) -> Iterator[Doorman]:
    with _doorman(tmp_path) as served:
        yield served


def _write_keys(path: Path, *keys: str) -> None:
    """As kubelet updates a mounted Secret: a new file swapped in atomically."""
    doc = {"keys": [{"caller": f"caller-{i}", "sha256": digest_of(k)} for i, k in enumerate(keys)]}
    path.with_suffix(".new").write_text(json.dumps(doc))
    os.replace(path.with_suffix(".new"), path)


@pytest.fixture
def keys_path(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    _write_keys(path, KEY)
    return path


@pytest.fixture
def keyed(tmp_path: Path, keys_path: Path) -> Iterator[Doorman]:
    with _doorman(tmp_path, **{"keys-file": str(keys_path)}) as served:
        yield served


def _activity(admin: str) -> Activity:
    with urllib.request.urlopen(admin + SPEED_PATH, timeout=10) as resp:
        activity = reading_from_answer(resp.read(), 0.0, "u0").activity
    assert activity is not None
    return activity


def _told(message: str) -> None:
    """The one message every slot route carries."""
    assert f"{NAMESPACE}/{MODEL} is asleep and waking" in message
    assert f"about {WAKE_S} s" in message
    assert ROUTER in message and f"model `{NAMESPACE}/{MODEL}`" in message


def _openai(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_the_official_clients_are_told_to_come_back_or_go_through_the_router(
        door: Doorman) -> None:
    calls: list[Callable[[openai.OpenAI], Any]] = [
        lambda c: c.chat.completions.create(model=MODEL, messages=HI),  # type: ignore[arg-type]
        lambda c: c.completions.create(model=MODEL, prompt="hi"),
        lambda c: c.embeddings.create(model=MODEL, input="hi"),
    ]
    with _openai(door.url) as client:
        for call in calls:
            with pytest.raises(openai.APIStatusError) as asleep:
                call(client)
            assert asleep.value.status_code == 503
            assert asleep.value.response.headers["Retry-After"] == str(WAKE_S)
            assert asleep.value.response.headers[ASLEEP] == "1"
            _told(asleep.value.message)
        assert list(client.models.list()) == []
    native = ollama.Client(host=door.url)
    for ask in (lambda: native.chat(model=MODEL, messages=HI),
                lambda: native.generate(model=MODEL, prompt="hi"),
                lambda: native.embed(model=MODEL, input="hi")):
        with pytest.raises(ollama.ResponseError) as refused:
            ask()
        assert refused.value.status_code == 503
        _told(refused.value.error)
    assert native.list().models == [] and native.ps().models == []
    assert http_ok(door.url + "/healthz") and http_ok(door.admin + "/healthz")
    activity = _activity(door.admin)
    # Six slot requests, each a wish to wake; the listings and probes are none.
    assert (activity.arrived, activity.in_flight, activity.queued, activity.closed) == (
        6, 0, 0, True)


def test_a_refused_key_never_counts_and_the_key_check_answers_as_the_gateways(
        keyed: Doorman) -> None:
    with _openai(keyed.url, "lmk-wrong") as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model=MODEL, messages=HI)
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()
    assert _activity(keyed.admin).arrived == 0
    with _openai(keyed.url, KEY) as client:
        with pytest.raises(openai.APIStatusError) as asleep:
            client.chat.completions.create(model=MODEL, messages=HI)
        assert asleep.value.status_code == 503
        _told(asleep.value.message)
        assert list(client.models.list()) == []
    assert _activity(keyed.admin).arrived == 1
    nonce = "0123456789abcdef" * 2
    assert _key_check(keyed.url, nonce, key_proof(bytes.fromhex(digest_of(KEY)), nonce)) == 204
    assert _key_check(keyed.url, nonce, key_proof(bytes.fromhex(digest_of("x")), nonce)) == 401
    assert _key_check(keyed.url, "not-a-nonce", "00" * 32) == 400
    assert _activity(keyed.admin).arrived == 1  # the router's checks are no wish to wake


def _listed(client: openai.OpenAI) -> bool:
    try:
        return list(client.models.list()) == []
    except openai.AuthenticationError:
        return False


def _key_check(url: str, nonce: str, proof: str) -> int:
    request = urllib.request.Request(url + KEY_CHECK_PATH, headers={
        KEY_NONCE_HEADER: nonce, KEY_PROOF_HEADER: proof})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_huge_body_is_answered_without_being_waited_for(door: Doorman) -> None:
    """Headers announcing 100 MB and not a byte of it: the answer comes at
    once (the doorman never reads a body), and the doorman still serves."""
    host, port = door.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as raw:
        raw.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000000\r\n\r\n")
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 503 ")
    assert http_ok(door.url + "/readyz")
    assert _activity(door.admin).arrived == 1


def test_a_changed_keys_secret_reaches_the_doorman(keyed: Doorman, keys_path: Path) -> None:
    late = "lmk-doorman-added-later-93b1"
    with _openai(keyed.url, late) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        _write_keys(keys_path, KEY, late)
        wait_until("the new key accepted", lambda: _listed(client), 60)
