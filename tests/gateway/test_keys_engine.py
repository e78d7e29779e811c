"""API keys in front of the REAL llama-server (one slot, one thread; built by
hack/build-engines.sh, serving the Gemma 3 270M GGUF), with the official
`openai` client sending the key: no key or a wrong one is refused before the
engine does any work, the key's caller is the ledger's, and a background key
asking for foreground is served as background. The stand-in version with every
route and the `ollama` client: test_keys.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from localmodel.gateway.keys import digest_of
from localmodel.gateway.server import RunningGateway, start_gateway
from localmodel.gateway_contract import GatewayConfig
from tests.gateway.llama import decode_total, llama_server, wait_engine
from tests.harness.engines import LlamaServer

pytestmark = [pytest.mark.engine, pytest.mark.llama]

APP_KEY = "lmk-app-6f1e2d3c4b5a69788796"
JOB_KEY = "lmk-job-0a1b2c3d4e5f60718293"
SAY_HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(tmp_path_factory.mktemp("keys-engine"), slots=1) as running:
        yield running


@pytest.fixture
async def gateway(engine: LlamaServer, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"caller": "app", "sha256": digest_of(APP_KEY)},
        {"caller": "job", "sha256": digest_of(JOB_KEY), "priority": "background"},
    ]}))
    config = GatewayConfig(
        upstream=engine.url, engine="llama-server", listen_host="127.0.0.1", listen_port=0,
        slots=1, max_tokens=16, calibrate_tokens=0, keys_file=str(keys),
    )
    running = await start_gateway(config, lambda line: None)
    yield running
    await running.stop()
    async with aiohttp.ClientSession() as session:
        await wait_engine(session, engine, 0)


def client(gw: RunningGateway, key: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0,
                              default_headers=headers)


async def test_keys_in_front_of_the_real_engine(
    engine: LlamaServer, gateway: RunningGateway
) -> None:
    async with aiohttp.ClientSession() as session:
        decoded = await decode_total(session, engine)
        for key in ("", "lmk-wrong", APP_KEY + "0"):
            async with client(gateway, key or "none") as bad:
                with pytest.raises(openai.AuthenticationError):
                    await bad.chat.completions.create(
                        model="gemma", messages=SAY_HI, max_tokens=4)  # type: ignore[arg-type]
                with pytest.raises(openai.AuthenticationError):
                    await bad.models.list()
        assert await decode_total(session, engine) == decoded  # the engine did no work
        async with client(gateway, APP_KEY, **{"X-LocalModel-Caller": "root"}) as app:
            reply = await app.chat.completions.create(
                model="gemma", messages=SAY_HI, max_tokens=4)  # type: ignore[arg-type]
        assert reply.choices[0].message.content
        assert await decode_total(session, engine) > decoded
        async with client(gateway, JOB_KEY, **{"X-Priority": "foreground"}) as job:
            await job.chat.completions.create(
                model="gemma", messages=SAY_HI, max_tokens=4)  # type: ignore[arg-type]
        async with session.get(gateway.admin_url + "/ledger") as resp:
            entries = (await resp.json())["entries"]
    served = [(e["caller"], e["priority"], e["outcome"]) for e in entries
              if e["outcome"] != "unauthorized"]
    assert served == [("app", "foreground", "ok"), ("job", "background", "ok")]
    refused = [e for e in entries if e["outcome"] == "unauthorized"]
    assert len(refused) == 6 and {e["caller"] for e in refused} == {"anonymous"}
