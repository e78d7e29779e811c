"""What the router needs of a request's body, and nothing more. Pure.

The body is parsed once, bounded like the gateway bounds it
(localmodel.gateway_contract.bounds), and only what routing needs is kept: the route
its `model` names, the session's key, an estimate of the prompt's tokens, and
the bytes to relay (the caller's own, or with `model` made the served name
when the caller wrote namespace/name). The parsed body is not returned: it
is garbage once `wanted` returns, before the request is relayed, so a
request waiting for a replica's answer holds its bytes and no parse
(router/admission.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localmodel.gateway_contract import GatewayConfig, client_api
from localmodel.gateway_contract.bounds import TooLarge, check_bounds
from localmodel.router.session import prompt_tokens, session_key
from localmodel.router.table import (
    Ambiguous,
    Found,
    ModelRoute,
    RouteTable,
    listed_names,
    lookup,
    open_models,
)

SESSION_PATHS = ("/v1/chat/completions", "/v1/completions", client_api.CHAT_PATH,
                 client_api.GENERATE_PATH)


class BadRequest(Exception):
    """A request the router refuses before any replica: the status and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Wanted:
    """What a request wants: its model's route, session key, prompt tokens and the bytes to send."""

    route: ModelRoute
    key: str | None  # the session's key; None off the session paths or without one
    prompt: int  # the prompt's tokens, estimated
    data: bytes  # what goes to the replica


def wanted(raw: bytes, path: str, session_header: str | None, salt: bytes, table: RouteTable,
           bounds: GatewayConfig) -> Wanted:
    """Parse `raw` and keep what routing needs; BadRequest names what is wrong."""
    body = _parsed(raw, bounds)
    field = "model" if path != client_api.SHOW_PATH or "model" in body else "name"
    asked = body.get(field)
    if not isinstance(asked, str) or not asked.strip():
        raise BadRequest(400, f"{field}: missing or not a string; this endpoint serves "
                              f"several models and {field} picks one: "
                              f"{', '.join(listed_names(table, open_models(table))) or 'none'}")
    found = lookup(table, asked)
    if isinstance(found, Ambiguous):
        raise BadRequest(400, found.message)
    if not isinstance(found, Found):
        raise BadRequest(404, found.message)
    key = session_key(session_header, body, salt) if path in SESSION_PATHS else None
    data = raw
    if asked != found.route.name:
        body[field] = found.route.name
        data = json.dumps(body).encode()
    return Wanted(found.route, key, prompt_tokens(body), data)


def _parsed(raw: bytes, bounds: GatewayConfig) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body is not a JSON object")
    try:
        check_bounds(body, bounds)
    except TooLarge as exc:
        raise BadRequest(413, str(exc)) from None
    return body
