"""The router's signing Secret (controller/signing.py): created with a fresh
key when missing, never overwritten, its public key what the gateways get;
a Secret holding no key is reported, not replaced. The decision is pure
(`signing_secret_plan`); `RouterSigning` is run against an aiohttp server on
loopback standing in for the API server, which keeps what is created."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.controller.config import parse_config
from localmodel.controller.signing import (
    KEY_FIELD,
    MAX_AGE_SECONDS,
    BadSigningSecret,
    RouterSigning,
    signing_secret,
    signing_secret_plan,
)
from localmodel.controller.writer import Kube
from localmodel.gateway_contract.marks import key_from_pem, pem_of, public_key_text
from localmodel.kube import Credentials
from localmodel.render import RenderOptions
from localmodel.settings import ConfigError

pytestmark = pytest.mark.unit

KEY = Ed25519PrivateKey.generate()
NS, NAME = "localmodel-system", "localmodel-router-signing"


def _unused() -> Ed25519PrivateKey:
    raise AssertionError("a key was made although one exists")


def test_a_missing_secret_is_created_with_a_fresh_key_whose_public_half_is_rendered() -> None:
    plan = signing_secret_plan(None, NS, NAME, lambda: KEY)
    assert plan.public_key == public_key_text(KEY)
    assert plan.create is not None
    meta = plan.create["metadata"]
    assert (plan.create["kind"], meta["namespace"], meta["name"]) == ("Secret", NS, NAME)
    pem = base64.b64decode(plan.create["data"][KEY_FIELD])
    assert key_from_pem(pem).private_bytes_raw() == KEY.private_bytes_raw()


def test_an_existing_key_is_read_never_replaced() -> None:
    existing = signing_secret(NS, NAME, pem_of(KEY))
    plan = signing_secret_plan(existing, NS, NAME, _unused)
    assert plan.create is None and plan.public_key == public_key_text(KEY)
    # The private key is kept to sign the operator's closes, and never printed.
    assert plan.private_key is not None
    assert plan.private_key.private_bytes_raw() == KEY.private_bytes_raw()
    assert "private" not in repr(plan) and plan == signing_secret_plan(existing, NS, NAME,
                                                                       _unused)


@pytest.mark.parametrize(("data", "reason"), [
    ({}, f"no data.{KEY_FIELD}"),
    ({KEY_FIELD: "not base64!"}, "is not base64"),
    ({KEY_FIELD: base64.b64encode(b"hello").decode()}, "not a PEM private key"),
])
def test_a_secret_without_a_usable_key_is_reported_not_overwritten(
        data: dict[str, str], reason: str) -> None:
    existing = {"kind": "Secret", "metadata": {"name": NAME, "namespace": NS}, "data": data}
    with pytest.raises(BadSigningSecret) as err:
        signing_secret_plan(existing, NS, NAME, _unused)
    assert f"{NS}/{NAME}" in str(err.value) and reason in str(err.value)


def test_the_secrets_name_is_a_flag_checked_at_start() -> None:
    config = parse_config(["--router-namespace", NS, "--router-signing-secret", "my-key"], {})
    assert config.router_signing_secret == "my-key"
    with pytest.raises(ConfigError, match="router-signing-secret"):
        parse_config(["--router-signing-secret", "Not/A/Name"], {})


@asynccontextmanager
async def api_server(secrets: dict[str, Any], writes: list[str]) -> AsyncIterator[str]:
    """A stand-in for the API server: GET and POST of Secrets in NS only."""

    async def get(request: web.Request) -> web.Response:
        found = secrets.get(request.match_info["name"])
        return (web.json_response(found) if found is not None
                else web.json_response({"kind": "Status", "code": 404}, status=404))

    async def create(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        writes.append(body["metadata"]["name"])
        if body["metadata"]["name"] in secrets:
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        secrets[body["metadata"]["name"]] = body
        return web.json_response(body, status=201)

    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NS}/secrets/{{name}}", get)
    app.router.add_post(f"/api/v1/namespaces/{NS}/secrets", create)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def test_the_operator_makes_the_key_once_and_renders_it_until_the_secret_is_deleted() -> None:
    secrets: dict[str, Any] = {}
    writes: list[str] = []
    clock = [0.0]
    wakes: list[float] = []

    async def main() -> list[str]:
        keys = []
        async with api_server(secrets, writes) as server, \
                Kube(Credentials(server=server)) as kube:
            signing = RouterSigning(kube, NS, NAME, clock=lambda: clock[0], wake=wakes.append)
            options = await signing.options(RenderOptions())
            keys.append(options.router_key)
            clock[0] += 20
            assert await signing.options(options) is options  # not read again yet
            assert wakes == [MAX_AGE_SECONDS, MAX_AGE_SECONDS - 20]  # a pass when it is due
            clock[0] += 3600
            keys.append((await signing.options(options)).router_key)  # read, not made again
            kept = signing.private_key()  # what the operator signs its closes with
            assert kept is not None and public_key_text(kept) == keys[0]
            del secrets[NAME]  # a rotation
            clock[0] += 3600
            keys.append(await signing.public_key())
            rotated = signing.private_key()
            assert rotated is not None and public_key_text(rotated) == keys[-1]
        return keys

    made, again, rotated = asyncio.run(main())
    assert writes == [NAME, NAME]  # created twice: at first, and after the deletion
    assert made == again != rotated
    stored = key_from_pem(base64.b64decode(secrets[NAME]["data"][KEY_FIELD]))
    assert rotated == public_key_text(stored)
