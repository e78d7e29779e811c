"""The router in front of a REAL gateway in front of the REAL llama-server
(tests/gateway/test_engine.py's engine and gateway, as the operator renders
them): the official `openai` client through the router, the answer's
accounting remembered for the session, and a caller who leaves through the
router leaving the engine idle (its /slots, its decode counter still)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from localmodel.gateway_contract.headers import ROUTE_HEADER
from localmodel.router.config import RouterConfig
from localmodel.router.server import RunningRouter, start_router
from localmodel.router.static import static_source
from tests.gateway.harness import GatewayFactory, wait_until
from tests.gateway.llama import decode_total, leave_while_decoding, wait_engine
from tests.gateway.test_engine import STOP_BOUND, engine, gateway  # noqa: F401 - fixtures
from tests.harness.engines import LlamaServer

pytestmark = [pytest.mark.engine, pytest.mark.llama]

MODEL = "gemma3:270m"


@pytest.fixture
async def routed(
    gateway: GatewayFactory,  # noqa: F811 - the fixture imported above
) -> AsyncIterator[tuple[RunningRouter, list[str], list[str]]]:
    gw, gw_log = await gateway()
    log: list[str] = []
    config = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                          admin_port=0)
    router = await start_router(
        config, static_source([f"{MODEL}={gw.url}|{gw.admin_url}"]), log.append)
    yield router, log, gw_log
    await router.stop()


async def test_openai_client_through_the_router_to_the_real_engine(
        routed: tuple[RunningRouter, list[str], list[str]]) -> None:
    router, log, _ = routed
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        messages = [{"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": "Name a colour."}]
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=6)  # type: ignore[arg-type]
        done = raw.parse()
        assert done.choices[0].message.content
        assert raw.headers[ROUTE_HEADER] == "owner"
        assert done.usage is not None
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, stream=True)  # type: ignore[arg-type]
        assert [c async for c in stream]
    # The session (the opening's fingerprint) is remembered with the tokens the
    # replica holds: the non-streamed answer's usage, then the stream's timings.
    book = router.router.book
    assert len(book) == 1
    key = json.loads(log[0])["session"]
    held = book.held(f"static/{MODEL}\0{key}")
    assert next(iter(held.values())) >= done.usage.prompt_tokens


async def test_a_caller_who_leaves_through_the_router_leaves_the_engine_idle(
        engine: LlamaServer,  # noqa: F811
        routed: tuple[RunningRouter, list[str], list[str]]) -> None:
    router, log, gw_log = routed
    body = {"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 2000,
            "stream": True}
    async with aiohttp.ClientSession() as session:
        left = await leave_while_decoding(session, engine, router.port, body)
        stopped = await wait_engine(session, engine, 0, timeout=10)
        before = await decode_total(session, engine)
        await asyncio.sleep(0.3)
        assert await decode_total(session, engine) == before, "the engine kept decoding"
    print(f"through the router: engine slot idle {1000 * (stopped - left):.1f} ms after "
          "the caller left")
    assert stopped - left < STOP_BOUND
    await wait_until(lambda: len(log) == 1 and len(gw_log) == 1, timeout=10)
    assert json.loads(log[0])["status"] == 499
    assert json.loads(gw_log[0])["cancel_reason"] == "disconnect"
