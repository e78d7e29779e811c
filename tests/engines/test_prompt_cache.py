"""The engines' host-memory prompt cache, bounded as the operator renders it
(docs/engine-facts.md#the-prompt-cache-in-host-memory): llama-server's
`--cache-ram` and, for Ollama, `LLAMA_ARG_CACHE_RAM` inherited by its
llama-server child, against the real engines.

Each test sends the same sequence of distinct prompts (no two share a prefix)
and then two of them again: one seen two prompts ago, one seen first. What the
engine reports as reused (llama-server `timings.cache_n`, Ollama
`prompt_eval_cached_count`) says whether a prompt's state was kept: with a
bound that holds about two states the older one was evicted, with the
engine's default (8192 MiB) both come back, with `promptCache: 0` neither."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from localmodel.engines import ollama as ollama_facts
from localmodel.facts.machine import from_this_machine
from localmodel.rules.evaluate import tune
from localmodel.rules.model import Tuning
from tests.builders import MakeLocalModel
from tests.engines.conftest import OllamaFactory
from tests.engines.real_ollama import MODEL
from tests.harness.engines import llama_server

pytestmark = pytest.mark.engine

# A prompt of PROMPT_WORDS words (62 tokens) keeps a state of 1.94 MiB with the
# test model (llama-server's log, measured with `--cache-ram 1`): BOUND holds two.
PROMPT_WORDS = 60
BOUND = "5Mi"
SEQUENCE = 6  # prompts 0..5; then 4 (two ago) and 0 (the first) again
WORDS = [
    "river", "stone", "lantern", "orbit", "maple", "quartz", "harbor", "violet", "ember",
    "falcon", "meadow",
]


def prompt(tag: int) -> str:
    return f"p{tag} " + " ".join(WORDS[(tag * 7 + i * i) % len(WORDS)]
                                 for i in range(PROMPT_WORDS - 1))


def rendered(engine: str, prompt_cache: str | None) -> Tuning:
    """The rules' settings for the test model on this machine, one CPU."""
    lm = MakeLocalModel("cache").engine(engine).gguf().cpu(1).context(2048)
    if prompt_cache is not None:
        lm = lm.spec(promptCache=prompt_cache)
    return tune(lm.obj().spec, from_this_machine(), 1)


def replay(ask: Callable[[str], int]) -> tuple[int, int]:
    """Send the sequence; return the reused tokens of prompt 4 and prompt 0 sent again."""
    for tag in range(SEQUENCE):
        ask(prompt(tag))
    return ask(prompt(SEQUENCE - 2)), ask(prompt(0))


def llama_replay(tmp_path: Path, args: tuple[str, ...]) -> tuple[tuple[int, int], str]:
    with llama_server(tmp_path, rendered=args) as engine:
        def ask(text: str) -> int:
            status, doc = engine.api("/completion", {"prompt": text, "n_predict": 1})
            assert status == 200, doc
            return int(doc["timings"]["cache_n"])

        return replay(ask), engine.log_text()


def ollama_replay(ollama: OllamaFactory, env: dict[str, str]) -> tuple[int, int]:
    own = {k: v for k, v in env.items() if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}
    server = ollama(env=own)

    def ask(text: str) -> int:
        status, doc = server.api("/api/generate", {
            "model": MODEL, "prompt": text, "raw": True, "stream": False,
            "options": {"num_predict": 1}})
        assert status == 200, doc
        return int(doc.get("prompt_eval_cached_count", 0))

    return replay(ask)


def test_llama_server_cache_ram_bounds_what_it_keeps(tmp_path: Path) -> None:
    t = rendered("llama-server", BOUND)
    assert t.args[t.args.index("--cache-ram") + 1] == "5"
    (recent, first), log = llama_replay(tmp_path / "bounded", t.args)
    assert recent > PROMPT_WORDS // 2, "the state of two prompts ago was not kept"
    assert first < 5, "the first prompt's state outlived a bound of two states"
    assert "removing oldest entry" in log


def test_llama_server_default_keeps_every_prompt_and_zero_keeps_none(tmp_path: Path) -> None:
    t = rendered("llama-server", BOUND)
    i = t.args.index("--cache-ram")
    unbounded = t.args[:i] + t.args[i + 2:]  # the engine's default: 8192 MiB
    (recent, first), _ = llama_replay(tmp_path / "default", unbounded)
    assert recent > PROMPT_WORDS // 2 and first > PROMPT_WORDS // 2, (recent, first)
    off = rendered("llama-server", "0")
    assert off.args[off.args.index("--cache-ram") + 1] == "0"
    (recent, first), _ = llama_replay(tmp_path / "off", off.args)
    assert recent < 5 and first < 5, (recent, first)


def test_ollama_child_inherits_the_bound(ollama: OllamaFactory) -> None:
    t = rendered("ollama", BOUND)
    assert t.env[ollama_facts.PROMPT_CACHE_ENV] == "5"
    recent, first = ollama_replay(ollama, t.env)
    assert recent > PROMPT_WORDS // 2, "the state of two prompts ago was not kept"
    assert first < 5, "the first prompt's state outlived a bound of two states"


def test_ollama_default_keeps_every_prompt_and_zero_keeps_none(ollama: OllamaFactory) -> None:
    env = dict(rendered("ollama", BOUND).env)
    del env[ollama_facts.PROMPT_CACHE_ENV]  # Ollama's own default: the child's 8192 MiB
    recent, first = ollama_replay(ollama, env)
    assert recent > PROMPT_WORDS // 2 and first > PROMPT_WORDS // 2, (recent, first)
    recent, first = ollama_replay(ollama, dict(rendered("ollama", "0").env))
    assert recent < 5 and first < 5, (recent, first)
