"""The answers the gateway and the router make themselves, in the shape of
the API the caller speaks: JSON bodies and errors (Ollama's `{"error": "..."}`,
OpenAI's `{"error": {"message": ...}}`). One home, so a caller sees the same
error shape from either program.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


def json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    try:
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate from an upstream's JSON: kept escaped
        raw = json.dumps(body, separators=(",", ":")).encode()
    return web.Response(
        status=status,
        body=raw,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, *, openai: bool = False
) -> web.Response:
    """The gateway's own error, in the shape of the API the caller speaks:
    Ollama's {"error": "..."}, or OpenAI's {"error": {"message": ...}} on the
    OpenAI routes (the `openai` client shows only `error.message`)."""
    if openai:
        return json_response(status, openai_error(message, status), headers)
    return json_response(status, {"error": message}, headers)


def openai_error(message: str, status: int | None = None) -> dict[str, Any]:
    """OpenAI's error object; a caller's 4xx is an `invalid_request_error`."""
    kind = "invalid_request_error" if status and 400 <= status < 500 else "gateway_error"
    return {"error": {"message": message, "type": kind, "code": status}}
