"""Admission before work, against the Ollama stand-in (not Ollama): a request
holds its place among the slots and the queue from the moment it arrives, so a
full queue refuses the next one before reading a byte of its body; bodies are
read and parsed --body-reads at a time; a body over its size, message count or
string size is refused with 413 naming the limit, in the error shape the
gateway answers on both APIs, and every refusal gives its place back. The
gateway's memory under such bodies, as a real process, is
test_hostile_memory.py's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import ollama
import openai
import pytest

from tests.gateway.harness import RawClient, RigFactory, books_reach, wait_until
from tests.gateway.ollama_standin import StandinOllama

CHAT = {"model": "standin:1b", "messages": [{"role": "user", "content": "hi"}]}


async def send_head(port: int, path: str, length: int, part: bytes = b"") -> RawClient:
    """A request whose headers announce `length` bytes of body, of which only
    `part` is sent (the rest: `finish`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    writer.write(head.encode() + part)
    await writer.drain()
    return RawClient(reader, writer)


async def finish(client: RawClient, rest: bytes) -> None:
    client.writer.write(rest)
    await client.writer.drain()


def error_of(body: bytes, path: str = "/api/chat") -> str:
    """The message of the gateway's error, checked to be in the shape of the
    route's API: Ollama's {"error": "..."}, OpenAI's {"error": {"message": ...}}."""
    doc = json.loads(body)
    error = doc["error"]
    if path.startswith("/v1/"):
        assert error["type"] == "invalid_request_error" and isinstance(error["code"], int), doc
        error = error["message"]
    assert isinstance(error, str), doc
    return error


async def test_a_full_queue_refuses_at_once_without_reading_the_body(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0.01, tokens=300), max_queue=1)
    board = rig.gateway.gateway.board
    holder = await RawClient.send(rig.port, "/api/chat", CHAT)
    await wait_until(lambda: books_reach(board, 1))
    # Counted while its body is still arriving: the queue's one place is taken.
    reading = await send_head(rig.port, "/api/chat", len(json.dumps(CHAT)), b'{"model"')
    await wait_until(lambda: board.reserved == 1)
    # A body of 50 MB announced, none of it sent: refused at once, unread.
    refused = await send_head(rig.port, "/api/chat", 50_000_000)
    status, headers, body = await asyncio.wait_for(refused.response(), 2)
    assert (status, error_of(body)) == (503, "queue full (1 waiting)")
    assert int(headers["retry-after"]) >= 1
    await finish(reading, json.dumps(CHAT).encode()[len(b'{"model"'):])
    for client in (holder, reading):
        assert (await client.response())[0] == 200
    await wait_until(lambda: len(rig.log) == 3)
    outcomes = sorted(d["outcome"] for d in rig.log_docs())
    assert outcomes == ["ok", "ok", "rejected_queue_full"]
    assert (board.reserved, board.snapshot().busy, board.snapshot().queued) == (0, 0, 0)


async def test_bodies_are_read_and_parsed_body_reads_at_a_time(make_rig: RigFactory) -> None:
    rig = await make_rig(slots=2, body_reads=1)
    raw = json.dumps(CHAT).encode()
    slow = await send_head(rig.port, "/api/chat", len(raw), raw[:5])
    await wait_until(lambda: rig.gateway.gateway.board.reserved == 1)
    quick = await RawClient.send(rig.port, "/api/chat", CHAT)
    await asyncio.sleep(0.3)
    # The one read is the slow body's: the complete one waits its turn.
    assert rig.standin.requests == [] and rig.gateway.gateway.board.reserved == 2
    await finish(slow, raw[5:])
    for client in (slow, quick):
        assert (await client.response())[0] == 200


async def test_a_request_waits_its_turn_to_be_read_within_its_deadline(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(body_reads=1)
    raw = json.dumps(CHAT).encode()
    slow = await send_head(rig.port, "/api/chat", len(raw), raw[:5])
    await wait_until(lambda: rig.gateway.gateway.board.reserved == 1)
    late = await RawClient.send(rig.port, "/v1/chat/completions", CHAT,
                                {"X-Request-Timeout": "0.3"})
    status, _, body = await asyncio.wait_for(late.response(), 2)
    assert (status, json.loads(body)["error"]) == (504, {
        "message": "deadline of 0.3s passed while waiting to read the body",
        "type": "gateway_error",
        "code": 504,
    })
    slow.close()
    await wait_until(lambda: len(rig.log) == 2)
    assert rig.gateway.gateway.board.reserved == 0


def messages(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "hi"}] * n


# (config, the body, the status, what the error names)
CASES: dict[str, tuple[dict[str, int], bytes, int, str]] = {
    "messages": (
        {"max_messages": 3},
        json.dumps({"messages": messages(4)}).encode(),
        413,
        "messages has 4 entries, over the limit of 3 (--max-messages)",
    ),
    "string": (
        {"max_string_bytes": 100},
        json.dumps({"messages": [{"role": "user", "content": "é" * 51}]}).encode(),
        413,
        "a string in messages is over the limit of 100 bytes per string (--max-string-bytes)",
    ),
    "body": (
        {"max_body_bytes": 1000},
        json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}).encode(),
        413,
        "request body is over the limit of 1000 bytes (--max-body-bytes)",
    ),
    "nesting": (
        {},
        b'{"messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        400,
        "malformed JSON: nested deeper than the gateway parses",
    ),
}


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_body_over_a_limit_is_refused_naming_it_and_gives_its_place_back(
    make_rig: RigFactory, path: str, case: str
) -> None:
    config, body, want_status, want_error = CASES[case]
    rig = await make_rig(**config)
    status, headers, answer = await (await RawClient.send(rig.port, path, body)).response()
    assert (status, error_of(answer, path)) == (want_status, want_error)
    assert headers["content-type"].startswith("application/json")
    assert rig.standin.requests == []
    await wait_until(lambda: len(rig.log) == 1)
    assert rig.log_docs()[0]["outcome"] == ("too_large" if status == 413 else "bad_request")
    assert rig.gateway.gateway.board.reserved == 0
    status, _, _ = await (await RawClient.send(rig.port, path, CHAT)).response()
    assert status == 200  # and the next normal chat is served


async def test_the_official_clients_read_the_limit_from_the_refusal(make_rig: RigFactory) -> None:
    rig = await make_rig(max_messages=2)
    chat: Any = messages(3)
    async with openai.AsyncOpenAI(base_url=rig.url + "/v1", api_key="x") as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="standin:1b", messages=chat)
    assert caught.value.status_code == 413 and "--max-messages" in str(caught.value)
    with pytest.raises(ollama.ResponseError) as refused:
        await ollama.AsyncClient(host=rig.url).chat(model="standin:1b", messages=chat)
    assert refused.value.status_code == 413
    assert refused.value.error == "messages has 3 entries, over the limit of 2 (--max-messages)"
