"""Each engine reads its own account of a generation in its own package
(engines/<name>/timing.py), found through its facts; the shared contract
(gateway_contract/timing.py) names no engine. Engine names come from the
registry, so a new engine's reader is checked here for free."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localmodel import engines
from localmodel.engines import timings
from localmodel.gateway.assemble import StreamWatcher
from localmodel.gateway.routes import Kind
from localmodel.gateway_contract import timing as contract
from localmodel.router.account import tokens_from_tail

pytestmark = pytest.mark.unit

CONTRACT = Path(contract.__file__)


@pytest.mark.parametrize("name", engines.NAMES)
def test_every_engine_has_a_timing_reader_beside_its_facts(name: str) -> None:
    reader = timings.reader(name)
    assert getattr(reader, "__name__", "") == f"{engines.package(engines.facts(name))}.timing"
    assert reader.KEYS and all(isinstance(key, str) and key for key in reader.KEYS)
    assert "usage" not in reader.KEYS  # OpenAI's, read by the contract for every engine
    assert timings.readers()[engines.NAMES.index(name)] is reader


@pytest.mark.parametrize("name", engines.NAMES)
def test_a_reader_reads_no_account_from_an_answer_without_one(name: str) -> None:
    timing = timings.reader(name).timing({}, "stop")
    assert timing == contract.EngineTiming(done_reason="stop")


@pytest.mark.parametrize("name", engines.NAMES)
def test_every_engine_reads_openai_usage_as_the_contract_does(name: str) -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 7,
             "prompt_tokens_details": {"cached_tokens": 20}}
    got = timings.reader(name).timing({"usage": usage}, "length")
    assert got == contract.timing_from_usage(usage, "length")
    assert (got.prompt_total, got.prompt_cached, got.prompt_evaluated) == (50, 20, 30)


@pytest.mark.parametrize("name", engines.NAMES)
def test_the_watcher_reads_the_lines_that_carry_an_engines_own_fields(name: str) -> None:
    """An OpenAI-compatible stream whose last chunk carries only the engine's
    own fields (no `usage`, no finish_reason): the gateway's watcher, built
    for that engine, reads that line and gives the reader what it said."""
    reader = timings.reader(name)
    own = {key: {"marker": 1} for key in reader.KEYS}
    watcher = StreamWatcher(Kind.OPENAI_CHAT, reader)
    watcher.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
    watcher.feed(b"data: " + json.dumps(own).encode() + b"\n\n")
    assert watcher.timing == reader.timing(own, None)


@pytest.mark.parametrize("name", engines.NAMES)
def test_the_router_finds_a_tail_by_every_engines_keys(name: str) -> None:
    """A tail whose last line names only the engine's own KEYS is read, and
    by that engine's reader."""
    seen: list[object] = []

    class Spy:
        KEYS = timings.reader(name).KEYS

        @staticmethod
        def timing(answer: object, finish_reason: str | None) -> contract.EngineTiming:
            seen.append(answer)
            return contract.EngineTiming(generated_tokens=2, prompt_total=40)

    doc = {key: 1 for key in Spy.KEYS}
    assert tokens_from_tail(json.dumps(doc).encode() + b"\n", (Spy(),)) == 42
    assert seen == [doc]


def test_the_contract_names_no_engine() -> None:
    text = CONTRACT.read_text()
    named = [name for name in engines.NAMES if re.search(re.escape(name), text, re.IGNORECASE)]
    titled = [e.TITLE for e in engines.FACTS if e.TITLE in text]
    assert (named, titled) == ([], [])


def test_an_engine_without_a_timing_reader_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered engine whose package has no timing module: the error names
    the engine and the module, rather than a bare import error."""
    name = engines.NAMES[0]
    timings.reader.cache_clear()
    monkeypatch.setattr(timings, "package", lambda facts: "localmodel.facts")  # no timing.py
    try:
        with pytest.raises(timings.NoTimingReader, match=f"engine {name}: no module "
                           r"localmodel\.facts\.timing"):
            timings.reader(name)
    finally:
        timings.reader.cache_clear()
