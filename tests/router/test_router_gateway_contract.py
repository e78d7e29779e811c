"""The router and the gateway share a contract, not internals
(gateway_contract/): each fact of their wire is defined once there and both
programs read it from there.

- every `X-LocalModel-*` header name is spelled only in the contract;
- the session's idle time, the length of a session name and the shape of a
  session key are defined once (no second `IDLE_S`, no second length);
- the tokens a replica holds of a session are read with the gateway's own
  parser of the engine's account (`held_tokens` over each engine's reader,
  engines/<name>/timing.py), and a hostile answer's numbers never become a
  count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from localmodel.engines import timings
from localmodel.gateway_contract import headers
from localmodel.gateway_contract.timing import MAX_HELD_TOKENS, held_tokens
from localmodel.router.account import tokens_from_tail
from localmodel.router.session import session_key
from tests.architecture import codebase

pytestmark = pytest.mark.unit

PACKAGE = codebase.PACKAGE
CONTRACT = PACKAGE / "gateway_contract"


def _programs() -> list[Path]:
    return sorted(m.path for m in codebase.under("router", "gateway"))


def _strings(path: Path) -> list[str]:
    tree = codebase.tree(path)
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _assigned(path: Path) -> set[str]:
    tree = codebase.tree(path)
    return {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)}


def test_the_wire_headers_are_spelled_only_in_the_contract() -> None:
    header = re.compile(r"^x-localmodel-[a-z-]+$", re.IGNORECASE)
    spelled = {str(p.relative_to(PACKAGE)): s for p in _programs() for s in _strings(p)
               if header.match(s)}
    assert spelled == {}


def test_session_facts_are_defined_once() -> None:
    once = {"IDLE_S", "SESSION_IDLE_S", "SESSION_HEADER", "MAX_SESSION_HEADER",
            "MAX_SESSION_CHARS", "SESSION_KEY_PATTERN", "OWNED_SESSION_HEADER", "ROUTE_HEADER"}
    again = {str(p.relative_to(PACKAGE)): sorted(_assigned(p) & once) for p in _programs()
             if _assigned(p) & once}
    assert again == {}
    assert {"SESSION_IDLE_S", "MAX_SESSION_CHARS", "SESSION_KEY_PATTERN"} <= _assigned(
        CONTRACT / "headers.py")


def test_a_session_header_is_keyed_on_as_many_characters_as_the_ledger_keeps() -> None:
    keep = headers.MAX_SESSION_CHARS
    same_prefix = "s" * keep
    assert session_key(same_prefix + "a", {}) == session_key(same_prefix + "b", {})
    assert session_key("a" + same_prefix, {}) != session_key("b" + same_prefix, {})


@pytest.mark.parametrize(("doc", "engine", "held"), [
    ({"usage": {"prompt_tokens": 40, "completion_tokens": 2}}, "ollama", 42),
    ({"usage": {"prompt_tokens": 40, "completion_tokens": 2}}, "llama-server", 42),
    ({"timings": {"cache_n": 30, "prompt_n": 10, "predicted_n": 2}}, "llama-server", 42),
    ({"prompt_eval_count": 40, "eval_count": 2, "done": True}, "ollama", 42),
    ({"usage": {"prompt_tokens": 40, "completion_tokens": 2},
      "timings": {"cache_n": 30, "prompt_n": 10, "predicted_n": 2}}, "llama-server", 42),
])
def test_held_tokens_agree_with_the_answering_gateways_own_reading(
        doc: dict[str, object], engine: str, held: int) -> None:
    """The router does not know which engine answered; what it reads is what
    the gateway of the engine that wrote the answer reads."""
    assert held_tokens(doc, timings.readers()) == held
    timing = timings.reader(engine).timing(doc, None)
    assert timing.prompt_total is not None and timing.generated_tokens is not None
    assert timing.prompt_total + timing.generated_tokens == held


@pytest.mark.parametrize("doc", [
    {"prompt_eval_count": float("nan"), "eval_count": 1},
    {"prompt_eval_count": float("inf"), "eval_count": 1},
    {"prompt_eval_count": -5, "eval_count": 1},
    {"prompt_eval_count": MAX_HELD_TOKENS, "eval_count": 1},
    {"usage": {"prompt_tokens": "40", "completion_tokens": 2}},
    {"usage": {"prompt_tokens": True, "completion_tokens": 2}},
    {"timings": {"cache_n": 1e300, "prompt_n": 1, "predicted_n": 1}},
    {"prompt_eval_count": 3},
    {"model": "x"},
    [1, 2],
])
def test_a_hostile_accounting_is_no_count(doc: object) -> None:
    assert held_tokens(doc, timings.readers()) is None


def test_the_router_reads_the_last_accounting_of_a_stream_tail() -> None:
    tail = (b'{"message":{"content":"a"},"done":false}\n'
            b'{"done":true,"prompt_eval_count":40,"eval_count":2}\n')
    assert tokens_from_tail(tail) == 42
    sse = (b'data: {"choices":[]}\n\ndata: {"timings":{"cache_n":1,"prompt_n":2,'
           b'"predicted_n":3}}\n\ndata: [DONE]\n\n')
    assert tokens_from_tail(sse) == 6
    assert tokens_from_tail(b'{"done":true,"prompt_eval_count":NaN,"eval_count":2}\n') is None
