"""Timing parse, for every engine: the answer its timing module gives as an
example of its dialect (`EXAMPLE`: a route, the answer's final object or last
chunk, the account it means) is read as that account by the engine's reader,
by the gateway's stream watcher built for the engine (the path the ledger,
the metrics and the speed read), and by the router's reading of an answer's
tail (how many tokens the replica now holds)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localmodel.engines import timings
from localmodel.gateway.assemble import StreamWatcher
from localmodel.gateway.routes import ROUTES
from localmodel.gateway_contract.timing import EngineTiming
from localmodel.router.account import tokens_from_tail
from tests.conformance.subjects import NAMES

pytestmark = pytest.mark.unit


def _example(name: str) -> tuple[str, dict[str, Any], EngineTiming]:
    """The engine's `EXAMPLE` (its timing module declares one: the suite's input)."""
    reader = timings.reader(name)
    assert hasattr(reader, "EXAMPLE"), (
        f"{name}'s timing module declares no EXAMPLE (route, answer, EngineTiming)")
    example: tuple[str, dict[str, Any], EngineTiming] = reader.EXAMPLE
    return example


@pytest.mark.parametrize("name", NAMES)
def test_the_engines_reader_reads_its_example_answer(name: str) -> None:
    _, answer, want = _example(name)
    assert want.generated_tokens and want.decode_seconds and want.prompt_seconds
    assert want.decode_tokens_per_second and want.prefill_tokens_per_second
    choices = answer.get("choices") or [{}]
    got = timings.reader(name).timing(answer, choices[0].get("finish_reason"))
    assert got == want


@pytest.mark.parametrize("name", NAMES)
def test_the_gateway_reads_the_example_as_the_end_of_a_stream(name: str) -> None:
    path, answer, want = _example(name)
    [route] = [r for r in ROUTES if r.path == path]
    watcher = StreamWatcher(route.kind, timings.reader(name))
    if route.is_ollama_native:
        first = {"model": answer.get("model"), "response": "tiny", "done": False}
        watcher.feed(json.dumps(first).encode() + b"\n")
        watcher.feed(json.dumps(answer).encode() + b"\n")
    else:
        delta = {"delta": {"content": "tiny"}} if "chat" in path else {"text": "tiny"}
        first = {"choices": [{"index": 0, **delta, "finish_reason": None}]}
        for doc in (first, answer):
            watcher.feed(b"data: " + json.dumps(doc).encode() + b"\n\n")
        watcher.feed(b"data: [DONE]\n\n")
    watcher.close()
    assert watcher.timing == want


@pytest.mark.parametrize("name", NAMES)
def test_the_router_reads_the_tokens_a_replica_holds_from_the_example(name: str) -> None:
    _, answer, want = _example(name)
    assert want.prompt_total is not None and want.generated_tokens is not None
    tail = b"data: " + json.dumps(answer).encode() + b"\n\ndata: [DONE]\n\n"
    assert tokens_from_tail(tail) == want.prompt_total + want.generated_tokens
