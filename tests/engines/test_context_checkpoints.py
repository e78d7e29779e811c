"""The context checkpoints of a sliding-window model, bounded as the operator
renders them (docs/engine-facts.md#context-checkpoints): llama-server's
`--ctx-checkpoints` and, for Ollama, `LLAMA_ARG_CTX_CHECKPOINTS` inherited by its
llama-server child, against the real engines and the Gemma 3 270M test model
(a 512-token window).

Each test sends a chat of three turns, each prompt the previous one extended, so
no checkpoint is invalidated: every prompt makes two near its end, which pile up
to llama.cpp's default of 32 per slot, and stay at the rendered 2. The engine's
trace log (`-lv 4`, `LLAMA_ARG_LOG_VERBOSITY=4`) names each one made ("created
context checkpoint N of MAX")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localmodel.engines import ollama as ollama_facts
from localmodel.facts.machine import from_this_machine
from localmodel.rules.evaluate import tune
from localmodel.rules.memory import CONTEXT_CHECKPOINTS
from localmodel.rules.model import Tuning
from tests.builders import MakeLocalModel
from tests.engines.conftest import OllamaFactory
from tests.engines.real_ollama import MODEL
from tests.harness.engines import llama_server

pytestmark = pytest.mark.engine

# The checkpoint lines are trace, shown at -lv 4 (llama.cpp common/log.cpp).
TRACE = {"LLAMA_ARG_LOG_VERBOSITY": "4"}
TURNS = 3
TURN_WORDS = 700  # > one micro-batch (512) + the window: each prompt makes its two
WORDS = ["river", "stone", "lantern", "orbit", "maple", "quartz", "harbor", "violet"]
MADE = re.compile(r"created context checkpoint (\d+) of (\d+)")


def chat() -> list[str]:
    """The prompts of a chat, each the previous one extended."""
    out, text = [], ""
    for turn in range(TURNS):
        text += f" turn {turn}: " + " ".join(WORDS[(turn * 5 + i * i) % len(WORDS)]
                                              for i in range(TURN_WORDS))
        out.append(text)
    return out


def made(log: str) -> list[tuple[int, int]]:
    """(checkpoint's place, the bound) for every checkpoint the log says was made."""
    return [(int(n), int(of)) for n, of in MADE.findall(log)]


def rendered(engine: str) -> Tuning:
    lm = MakeLocalModel("ckpt").engine(engine).gguf().cpu(1).context(4096)
    return tune(lm.obj().spec, from_this_machine(), 1)


def llama_chat(workdir: Path, args: tuple[str, ...]) -> str:
    with llama_server(workdir, rendered=args, env=TRACE) as engine:
        for text in chat():
            status, doc = engine.api("/completion", {"prompt": text, "n_predict": 1})
            assert status == 200, doc
        return engine.log_text()


def test_llama_server_keeps_the_rendered_checkpoints_and_by_default_more(
        tmp_path: Path) -> None:
    t = rendered("llama-server")
    i = t.args.index("--ctx-checkpoints")
    assert t.args[i + 1] == str(CONTEXT_CHECKPOINTS)
    bounded = made(llama_chat(tmp_path / "bounded", t.args))
    assert len(bounded) >= 2 * TURNS  # every prompt made its pair
    assert {of for _, of in bounded} == {CONTEXT_CHECKPOINTS}
    assert max(n for n, _ in bounded) == CONTEXT_CHECKPOINTS
    default = made(llama_chat(tmp_path / "default", t.args[:i] + t.args[i + 2:]))
    assert {of for _, of in default} == {32}
    assert max(n for n, _ in default) > CONTEXT_CHECKPOINTS  # they pile up unbounded


def test_ollama_child_inherits_the_checkpoint_bound(ollama: OllamaFactory) -> None:
    t = rendered("ollama")
    assert t.env[ollama_facts.CHECKPOINTS_ENV] == str(CONTEXT_CHECKPOINTS)
    own = {k: v for k, v in t.env.items() if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}
    server = ollama(env=own | TRACE)
    for text in chat():
        status, doc = server.api("/api/generate", {
            "model": MODEL, "prompt": text, "raw": True, "stream": False,
            "options": {"num_predict": 1}})
        assert status == 200, doc
    seen = made(server.log_text())
    assert len(seen) >= 2 * TURNS
    assert {of for _, of in seen} == {CONTEXT_CHECKPOINTS}
    assert max(n for n, _ in seen) == CONTEXT_CHECKPOINTS
