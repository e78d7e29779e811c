"""What one request body may hold beyond its size: how many chat messages and
how long any one string. Pure.

The body's size is bounded before it is read (--max-body-bytes); these bounds
are checked once it is parsed, so a body within its size that carries an
endless conversation or one giant string is refused with 413 and a message
that names the limit and its flag, before any of it is rewritten, queued or
sent upstream. The defaults and why they fit a real chat are in
localmodel.gateway_contract (`GatewayConfig`).
"""

from __future__ import annotations

from typing import Any

from localmodel.gateway_contract import GatewayConfig


class TooLarge(ValueError):
    """The body is over one of the bounds; the message names it."""


def check_bounds(body: dict[str, Any], config: GatewayConfig) -> None:
    """Raise TooLarge if `body` carries more messages or a longer string than allowed."""
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > config.max_messages:
        raise TooLarge(
            f"messages has {len(messages)} entries, over the limit of "
            f"{config.max_messages} (--max-messages)"
        )
    where = longest_string_over(body, config.max_string_bytes)
    if where is not None:
        raise TooLarge(
            f"a string in {where} is over the limit of {config.max_string_bytes} bytes "
            "per string (--max-string-bytes)"
        )


def longest_string_over(value: Any, limit: int) -> str | None:
    """The top-level field holding a string (key or value) over `limit` UTF-8
    bytes, or None. Walks without recursion: a parsed body may nest as deep as
    the parser allowed."""
    for key, item in value.items() if isinstance(value, dict) else ():
        if _over(key, limit):
            return "a key"
        stack = [item]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                if _over(node, limit):
                    return str(key)[:64]
            elif isinstance(node, dict):
                for k, v in node.items():
                    if _over(k, limit):
                        return str(key)[:64]
                    stack.append(v)
            elif isinstance(node, list):
                stack.extend(node)
    return None


def _over(text: str, limit: int) -> bool:
    # A character is 1 to 4 bytes in UTF-8: encode only when the count of
    # characters cannot tell.
    if len(text) > limit:
        return True
    if 4 * len(text) <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit
