"""What a caller sends reaches the gateway's access log (and its ledger)
bounded and cleaned (localmodel.printable): a body's `model` with terminal
escapes, carriage returns and forged log lines, 400 KiB long; an X-Request-Id
with a right-to-left override, 4000 long (aiohttp refuses control characters
in headers already). In front of the Ollama stand-in, which answers any model."""

from __future__ import annotations

import json

import aiohttp

from localmodel.gateway.ledger import MAX_ID
from tests.gateway.harness import RawClient, RigFactory, wait_until
from tests.gateway.ollama_standin import StandinOllama

HOSTILE = "\x1b[2J\x1b[H\rroot\n{\"msg\":\"forged\"}\u202e\ud800" + "m" * 400_000


async def test_a_hostile_model_string_and_request_id_are_logged_bounded_and_cleaned(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(StandinOllama(token_delay=0, tokens=2))
    body = json.dumps({"model": HOSTILE, "prompt": "x", "stream": False}).encode()
    # A bare socket: the official clients refuse to send such a header.
    raw = await RawClient.send(rig.port, "/api/generate", body,
                               {"X-Request-Id": "id\u202e" + "i" * 4000})
    status, headers, _ = await raw.response()
    raw.close()
    assert status == 200
    # Echoed as the ledger keeps it: a header that can be sent back.
    assert headers["x-request-id"].startswith("id\\u202eiii")
    async with aiohttp.ClientSession() as session:
        await wait_until(lambda: len(rig.log) == 1)
        async with session.get(rig.admin_url + "/ledger") as resp:
            (entry,) = (await resp.json())["entries"]
    (line,) = rig.log
    assert len(line) < 2000, len(line)  # not 400 KiB a line
    doc = json.loads(line)
    for shown in (doc["model"], entry["model"]):
        assert shown.startswith('\\x1b[2J\\x1b[H\\rroot\\n{"msg":"forged"}\\u202e\\ud800m')
        assert shown.endswith(f"...({len(HOSTILE)} chars in all)")
        assert len(shown) <= MAX_ID + 40
    for shown in (doc["request_id"], entry["request_id"]):
        assert shown.startswith("id\\u202eiii") and len(shown) <= MAX_ID + 40
    # The engine still got the model the caller asked for: only what is
    # printed is cleaned.
    assert rig.standin.requests[0][1]["model"] == HOSTILE
