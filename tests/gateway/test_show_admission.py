"""`POST /api/show` is admitted like every body (gateway/pipeline.py): it
holds a place among the slots and the queue before its body is read (a full
queue refuses it unread), its body is a JSON object within the bounds (413
naming the limit), and with keys on it needs one. And the router's question
about a key (GET /keycheck, gateway_contract `key_proof`): 204 for a proof of
a key in the file, 401 for any other, 400 when malformed, 204 with keys off.

The gateway runs in-process in front of the Ollama STAND-IN
(tests/gateway/ollama_standin.py, not Ollama)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from pathlib import Path

import aiohttp
import ollama
import pytest

from localmodel.engines.ollama import SHOW_PATH
from localmodel.gateway.keys import digest_of
from localmodel.gateway_contract.keys import (
    KEY_CHECK_PATH,
    KEY_NONCE_HEADER,
    KEY_PROOF_HEADER,
    key_proof,
)
from tests.gateway.harness import RawClient, RigFactory, books_reach, wait_until
from tests.gateway.ollama_standin import StandinOllama

KEY = "lmk-show-admission-5c1e0f9b7a"
CHAT = {"model": "standin:1b", "messages": [{"role": "user", "content": "hi"}]}
SHOW = {"model": "standin:1b"}


@pytest.fixture
def keys_path(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"caller": "team-a", "sha256": digest_of(KEY)}]}))
    return path


def _error(body: bytes) -> str:
    error = json.loads(body)["error"]
    assert isinstance(error, str)
    return error


async def test_show_without_a_key_is_refused_and_with_one_is_answered(
        make_rig: RigFactory, keys_path: Path) -> None:
    rig = await make_rig(keys_file=str(keys_path))
    refused = ollama.AsyncClient(host=rig.url)
    with pytest.raises(ollama.ResponseError) as no_key:
        await refused.show("standin:1b")
    assert no_key.value.status_code == 401
    assert rig.standin.requests == []  # the engine saw nothing
    shown = await ollama.AsyncClient(host=rig.url,
                                     headers={"Authorization": f"Bearer {KEY}"}).show("standin:1b")
    assert shown is not None
    assert [path for path, _ in rig.standin.requests] == [SHOW_PATH]


@pytest.mark.parametrize(("body", "status", "error"), [
    ({"model": "standin:1b", "x": "a" * 1000}, 413,
     "a string in x is over the limit of 100 bytes per string (--max-string-bytes)"),
    ({"model": "standin:1b", "messages": [{}] * 5}, 413,
     "messages has 5 entries, over the limit of 4 (--max-messages)"),
    (b'["standin:1b"]', 400, "request body must be a JSON object, got list"),
    (b"{", 400, "malformed JSON: Expecting property name enclosed in double quotes "
                "at line 1 column 2"),
])
async def test_a_show_body_out_of_bounds_is_refused_before_the_engine(
        make_rig: RigFactory, body: dict[str, object] | bytes, status: int, error: str) -> None:
    rig = await make_rig(max_string_bytes=100, max_messages=4)
    answer = await (await RawClient.send(rig.port, SHOW_PATH, body)).response()
    assert (answer[0], _error(answer[2])) == (status, error)
    assert rig.standin.requests == []
    await wait_until(lambda: len(rig.log) == 1)
    assert rig.log_docs()[0]["outcome"] == ("too_large" if status == 413 else "bad_request")
    assert rig.gateway.gateway.board.reserved == 0  # its place given back
    ok = await (await RawClient.send(rig.port, SHOW_PATH, SHOW)).response()
    assert ok[0] == 200


async def test_a_full_queue_refuses_a_show_unread(make_rig: RigFactory) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=300), slots=1, max_queue=0)
    board = rig.gateway.gateway.board
    holder = await RawClient.send(rig.port, "/api/chat", CHAT)
    await wait_until(lambda: books_reach(board, 1))
    refused = await RawClient.send(rig.port, SHOW_PATH, SHOW)
    status, _, body = await asyncio.wait_for(refused.response(), 30)
    assert (status, _error(body)) == (503, "queue full (0 waiting)")
    assert all(path != SHOW_PATH for path, _ in rig.standin.requests)
    assert (await holder.response())[0] == 200
    ok = await (await RawClient.send(rig.port, SHOW_PATH, SHOW)).response()
    assert ok[0] == 200
    await wait_until(lambda: board.reserved == 0)


async def test_a_show_holds_its_place_while_its_body_arrives(make_rig: RigFactory) -> None:
    rig = await make_rig(slots=1, max_queue=0)
    board = rig.gateway.gateway.board
    raw = json.dumps(SHOW).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    writer.write(f"POST {SHOW_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw[:3])
    await writer.drain()
    await wait_until(lambda: board.reserved == 1)
    chat = await (await RawClient.send(rig.port, "/api/chat", CHAT)).response()
    assert chat[0] == 503  # the show's body holds the one place
    writer.write(raw[3:])
    await writer.drain()
    assert (await RawClient(reader, writer).response())[0] == 200
    await wait_until(lambda: board.reserved == 0)


# ---- the router's key check ---------------------------------------------------------


def _check_headers(key: str, nonce: str | None = None) -> dict[str, str]:
    nonce = nonce or secrets.token_hex(16)
    return {KEY_NONCE_HEADER: nonce,
            KEY_PROOF_HEADER: key_proof(hashlib.sha256(key.encode()).digest(), nonce)}


async def test_the_key_check_accepts_only_a_proof_of_a_key_in_the_file(
        make_rig: RigFactory, keys_path: Path) -> None:
    keyed = await make_rig(keys_file=str(keys_path))
    open_rig = await make_rig()
    async with aiohttp.ClientSession() as http:
        async def status(url: str, headers: dict[str, str]) -> int:
            async with http.get(url + KEY_CHECK_PATH, headers=headers) as resp:
                return resp.status

        assert await status(keyed.url, _check_headers(KEY)) == 204
        assert await status(keyed.url, _check_headers(KEY + "x")) == 401
        # The key itself, or its digest, is no proof.
        assert await status(keyed.url, {"Authorization": f"Bearer {KEY}"}) == 400
        assert await status(keyed.url, {KEY_NONCE_HEADER: "0" * 32,
                                        KEY_PROOF_HEADER: digest_of(KEY)}) == 401
        good = _check_headers(KEY)
        assert await status(keyed.url, {**good, KEY_NONCE_HEADER: "Z" * 32}) == 400
        assert await status(keyed.url, {**good, KEY_PROOF_HEADER: "ab"}) == 400
        # Keys off: every caller may call, so every caller is accepted.
        assert await status(open_rig.url, _check_headers("anything")) == 204
    assert keyed.standin.requests == [] and open_rig.standin.requests == []
