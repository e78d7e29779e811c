"""Ownership only from the router, at a REAL gateway (in-process) in front of
the Ollama STAND-IN: the gateway keeps an owned session only with the
router's signed mark made for this replica (gateway_contract/marks.py), only on a
generation turn it served, and /slots lists session keys only to a read the
router signed. The callers here are stand-ins for hostile callers: they
send the owned-session header bare, with a mark of their own key, or with a
real mark lifted from another replica."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.engines import ollama
from localmodel.gateway_contract import SLOTS_PATH
from localmodel.gateway_contract.headers import OWNED_SESSION_HEADER
from localmodel.gateway_contract.marks import MARK_HEADER, OWNED, SLOTS, public_key_text, sign
from tests.gateway.harness import Rig, RigFactory

ROUTER = Ed25519PrivateKey.generate()
HERE = ("team-a", "chat-0")  # the replica's namespace and pod, as the operator renders them
SESSION = "h:0123456789abcdef01234567"
CHAT = {"model": "standin:1b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def _rig(make_rig: RigFactory, **overrides: Any) -> Rig:
    settings = {"router_key": public_key_text(ROUTER), "pod_namespace": HERE[0],
                "pod_name": HERE[1], **overrides}
    return await make_rig(**settings)


def _owned(key: Ed25519PrivateKey = ROUTER, where: tuple[str, str] = HERE,
           session: str = SESSION, at: float | None = None) -> dict[str, str]:
    mark = sign(key, OWNED, *where, session, time.time() if at is None else at)
    return {OWNED_SESSION_HEADER: session, MARK_HEADER: mark}


def _slots_mark(key: Ed25519PrivateKey = ROUTER, where: tuple[str, str] = HERE,
                purpose: str = SLOTS) -> dict[str, str]:
    return {MARK_HEADER: sign(key, purpose, *where, "", time.time())}


async def _listed(http: aiohttp.ClientSession, rig: Rig,
                  headers: dict[str, str] | None = None) -> dict[str, Any]:
    async with http.get(rig.url + SLOTS_PATH, headers=headers) as resp:
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
        return doc


async def test_a_callers_owned_session_mark_is_ignored_on_any_request(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    forged = [
        {OWNED_SESSION_HEADER: SESSION},  # bare, as any caller could before
        _owned(key=Ed25519PrivateKey.generate()),  # the caller's own key
        _owned(where=("team-b", "chat-0")),  # the router's mark for another namespace's chat-0
        _owned(where=("team-a", "chat-1")),  # ... for another replica of the model
        _owned(at=time.time() - 3600),  # an old one
        {**_owned(), OWNED_SESSION_HEADER: "h:ffffffffffffffffffffffff"},  # another session
    ]
    async with aiohttp.ClientSession() as http:
        for headers in forged:
            async with http.post(rig.url + "/api/chat", json=CHAT, headers=headers) as resp:
                assert resp.status == 200
        assert (await _listed(http, rig, _slots_mark()))["owned_sessions"] == []
    assert rig.gateway.gateway.pipeline.owned.listed() == []
    assert len(rig.standin.generations) == len(forged)  # every turn was served


async def test_the_routers_mark_on_a_served_chat_is_kept_and_listed_only_to_the_router(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    async with aiohttp.ClientSession() as http:
        async with http.post(rig.url + "/api/chat", json=CHAT, headers=_owned()) as resp:
            assert resp.status == 200
            # The mark is never echoed.
            assert MARK_HEADER.lower() not in {k.lower() for k in resp.headers}
        anyone = await _listed(http, rig)
        router = await _listed(http, rig, _slots_mark())
        # Marks that are not the router's /slots mark for this replica.
        for headers in (_slots_mark(key=Ed25519PrivateKey.generate()),
                        _slots_mark(where=("team-b", "chat-0")),
                        _slots_mark(purpose=OWNED)):
            assert (await _listed(http, rig, headers))["owned_sessions"] == []
    assert router["owned_sessions"] == [SESSION]
    assert anyone["owned_sessions"] == []
    # The rest of /slots is everyone's, as before.
    assert {k: v for k, v in anyone.items() if k != "owned_sessions"} == \
        {k: v for k, v in router.items() if k != "owned_sessions"}
    assert anyone["total"] == 1 and anyone["model"] == "standin:1b"


async def test_the_routers_mark_on_a_listing_or_a_refused_turn_owns_nothing(
        make_rig: RigFactory) -> None:
    rig = await _rig(make_rig)
    async with aiohttp.ClientSession() as http:
        async with http.get(rig.url + "/v1/models", headers=_owned()) as resp:
            assert resp.status == 200
        async with http.post(rig.url + "/api/chat", data=b"{not json", headers=_owned()) as resp:
            assert resp.status == 400
        async with http.post(rig.url + ollama.SHOW_PATH, json={"model": "standin:1b"},
                             headers=_owned()) as resp:
            assert resp.status < 500
        assert (await _listed(http, rig, _slots_mark()))["owned_sessions"] == []


async def test_a_gateway_without_the_routers_key_takes_no_mark_and_lists_no_key(
        make_rig: RigFactory) -> None:
    rig = await make_rig()  # no --router-key: no router, or one it was not told of
    async with aiohttp.ClientSession() as http:
        async with http.post(rig.url + "/api/chat", json=CHAT, headers=_owned()) as resp:
            assert resp.status == 200
        assert (await _listed(http, rig, _slots_mark()))["owned_sessions"] == []
    assert rig.gateway.gateway.pipeline.owned.listed() == []
