"""Engine facts the rules rely on, shown against the real Ollama (built by
hack/build-engines.sh; docs/engine-facts.md names each fact's sources).

Every server here runs the child with one thread (`LLAMA_ARG_THREADS=1` or
num_thread 1), except where a test needs a second value for a moment to see
which one wins. "The engine is working" is read from the llama-server child's
CPU time; "a reload" is a new llama-server process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from localmodel.engines.ollama import PS_PATH, SHOW_PATH
from tests.engines.conftest import OllamaFactory
from tests.engines.real_ollama import MODEL, cpu_seconds, wait_idle
from tests.harness.engines import (
    CHAT_TEMPLATE_ENV,
    GEMMA_CHAT_TEMPLATE,
    Ollama,
    gguf_keys,
    require,
    template_markers,
)

pytestmark = pytest.mark.engine

TUNED = "tuned:latest"
TUNED_CTX = 1024
ONE_THREAD = {"LLAMA_ARG_THREADS": "1"}
# A generation that runs far longer than any bound below (temperature 0, so
# the control and the cancelled request produce the same tokens).
LONG = {
    "model": TUNED,
    "prompt": "Count from 1 to 2000, separated by commas: 1, 2, 3,",
    "options": {"num_predict": 3000, "temperature": 0, "seed": 1},
}


def flag(cmdline: list[str], name: str) -> str | None:
    return cmdline[cmdline.index(name) + 1] if name in cmdline else None


def generate(server: Ollama, model: str = TUNED, **options: Any) -> dict[str, Any]:
    status, body = server.api(
        "/api/generate",
        {"model": model, "prompt": "Hi", "stream": False, "options": {"num_predict": 1, **options}},
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def create_tuned(server: Ollama, workdir: Path) -> None:
    """The operator's tuned model: the same weights with num_ctx and num_thread."""
    modelfile = workdir / "Tuned.Modelfile"
    modelfile.write_text(f"FROM {MODEL}\nPARAMETER num_ctx {TUNED_CTX}\nPARAMETER num_thread 1\n")
    done = server.cli("create", TUNED, "-f", str(modelfile))
    assert done.returncode == 0, done.stdout + done.stderr


def loads(server: Ollama) -> int:
    return server.log_text().count("starting llama-server")


def thread_counts(server: Ollama) -> list[int]:
    return [int(n) for n in re.findall(r"system_info: n_threads = (\d+)", server.log_text())]


def test_child_command_line_carries_the_options(ollama: OllamaFactory) -> None:
    server = ollama(
        env={
            "OLLAMA_CONTEXT_LENGTH": "1536",
            "OLLAMA_NUM_PARALLEL": "1",
            "OLLAMA_FLASH_ATTENTION": "1",
            "OLLAMA_KV_CACHE_TYPE": "q8_0",
        }
    )
    generate(server, MODEL, num_thread=1, num_batch=64)
    child = server.runner().cmdline()
    assert (flag(child, "-c"), flag(child, "-np")) == ("1536", "1")
    assert (flag(child, "--cache-type-k"), flag(child, "--cache-type-v")) == ("q8_0", "q8_0")
    assert flag(child, "--flash-attn") == "on"
    assert (flag(child, "-b"), flag(child, "-ub")) == ("64", "64")
    assert flag(child, "-t") == "1"


def test_defaults_on_cpu(ollama: OllamaFactory, tmp_path: Path) -> None:
    server = ollama(env=ONE_THREAD)
    generate(server, MODEL)
    status, ps = server.api(PS_PATH)
    assert status == 200
    assert ps["models"][0]["context_length"] == 4096
    child = server.runner().cmdline()
    assert (flag(child, "-c"), flag(child, "-np")) == ("4096", "1")
    assert flag(child, "--flash-attn") == "auto"
    assert (Path(server.env["HOME"]) / ".ollama" / "id_ed25519").is_file()


def test_llama_arg_threads_reaches_the_child_and_num_thread_wins(ollama: OllamaFactory) -> None:
    host_cpus = os.cpu_count() or 1
    assert host_cpus >= 2, "needs a default thread count other than 1 to tell them apart"
    server = ollama(env=ONE_THREAD)
    generate(server, MODEL)  # no num_thread: Ollama passes no -t
    child = server.runner()
    assert flag(child.cmdline(), "-t") is None
    assert child.environ().get("LLAMA_ARG_THREADS") == "1"
    assert thread_counts(server) == [1]  # not the host's CPUs: the variable reached it

    generate(server, MODEL, num_thread=2)  # -t 2 beats LLAMA_ARG_THREADS=1
    child = server.runner()
    assert flag(child.cmdline(), "-t") == "2"
    assert child.environ().get("LLAMA_ARG_THREADS") == "1"
    assert thread_counts(server) == [1, 2]


@pytest.fixture
def tuned(ollama: OllamaFactory, tmp_path: Path) -> Ollama:
    """A server with the tuned model loaded by a caller that sent no options."""
    server = ollama(env=ONE_THREAD | {"OLLAMA_KEEP_ALIVE": "-1"})
    create_tuned(server, tmp_path)
    generate(server)
    return server


@pytest.mark.parametrize(
    "options",
    [{"num_ctx": 2048}, {"num_batch": 64}, {"num_thread": 2}],
    ids=lambda o: next(iter(o)),
)
def test_a_different_option_reloads_the_model(tuned: Ollama, options: dict[str, int]) -> None:
    before, pid = loads(tuned), tuned.runner().pid
    generate(tuned, **options)
    after = tuned.runner()
    print(f"{options}: llama-server {pid} -> {after.pid}, loads {before} -> {loads(tuned)}")
    assert after.pid != pid
    assert loads(tuned) == before + 1
    key = next(iter(options))
    cli = {"num_ctx": "-c", "num_batch": "-b", "num_thread": "-t"}[key]
    assert flag(after.cmdline(), cli) == str(options[key])


def test_the_loaded_options_do_not_reload(tuned: Ollama) -> None:
    child = tuned.runner()
    loaded_batch = flag(child.cmdline(), "-b")
    assert flag(child.cmdline(), "-c") == str(TUNED_CTX)
    before = loads(tuned)
    generate(tuned)  # no options: the Modelfile's values
    generate(tuned, num_ctx=TUNED_CTX, num_thread=1)  # the loaded values, sent explicitly
    assert loaded_batch is not None
    generate(tuned, num_batch=int(loaded_batch))
    assert tuned.runner().pid == child.pid
    assert loads(tuned) == before


def test_quantized_kv_cache_needs_flash_attention(ollama: OllamaFactory) -> None:
    off = ollama(env=ONE_THREAD | {"OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_FLASH_ATTENTION": "0"})
    status, body = off.api(
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 1}},
    )
    assert status == 500, body  # no silent fallback to f16 since v0.30
    # llama.cpp's words for it changed: b10069 (Ollama v0.32.2) "V cache
    # quantization requires flash_attn", b11076 (v0.34.4) "quantized V cache ...".
    assert re.search(r"(quantized V cache|V cache quantization) requires flash_attn",
                     off.log_text())

    auto = ollama(env=ONE_THREAD | {"OLLAMA_KV_CACHE_TYPE": "q8_0"})
    generate(auto, MODEL)
    child = auto.runner().cmdline()
    assert flag(child, "--cache-type-v") == "q8_0"
    assert flag(child, "--flash-attn") == "auto"  # auto turns it on for this CPU


def _send(port: int, body: dict[str, Any]) -> socket.socket:
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    return sock


def wait_busy(server: Ollama, start: float, timeout: float = 120.0) -> None:
    """Until the child has spent 0.5 CPU seconds since `start` (its CPU time
    then): into generation. Cumulative, so a loaded machine only makes it slower."""
    end = time.monotonic() + timeout
    child = server.runner()
    while cpu_seconds(child) - start < 0.5:
        assert time.monotonic() < end, "the engine never got busy"
        time.sleep(0.1)


def test_non_streaming_caller_that_leaves_stops_the_engine(tuned: Ollama) -> None:
    port = int(tuned.url.rsplit(":", 1)[1])
    # Control: the same generation, streamed, is still running well past the
    # moment the cancelled one must have stopped.
    control_for = 12.0
    control = _send(port, LONG | {"stream": True})
    control.settimeout(control_for + 30)
    seen = b""
    started = time.monotonic()
    while time.monotonic() - started < control_for:
        chunk = control.recv(65536)
        assert chunk, "the control generation ended early"
        seen += chunk
    assert b'"done":true' not in seen, "the control generation finished: pick a longer one"
    control.close()
    wait_idle(tuned.runner(), timeout=30)

    start = cpu_seconds(tuned.runner())
    caller = _send(port, LONG | {"stream": False})
    wait_busy(tuned, start)
    left = time.monotonic()
    caller.close()
    idle_after = wait_idle(tuned.runner(), timeout=control_for - 2, window=0.5, busy=0.05)
    print(
        f"ollama non-streaming disconnect: engine idle within {idle_after:.1f} s "
        f"(control still generating after {control_for:.0f} s)"
    )
    assert time.monotonic() - left < control_for - 2
    # Ollama records the abandoned request as a server error: count such log
    # lines as cancellations, not engine failures.
    assert re.search(r'\| 500 \|.*POST\s+"/api/generate"', tuned.log_text())


def chat_reply(server: Ollama) -> str:
    status, body = server.api("/api/chat", {
        "model": MODEL, "stream": False,
        "messages": [{"role": "user", "content": "Say hello in three words."}],
        "options": {"num_predict": 24, "temperature": 0, "seed": 1},
    })
    assert status == 200, body
    return str(body["message"]["content"])


def test_a_gguf_without_a_chat_template_gets_chatml_unless_one_is_given(
    ollama: OllamaFactory,
) -> None:
    """Created FROM the GGUF (as the pod's init step does), the model has no
    template: the file has no `tokenizer.chat_template`, so Ollama derives no
    template and no stop, warns, and chats through its llama-server child's
    ChatML fallback (the reply holds a literal `<|im_end|>`). The child
    inherits Ollama's environment, so `LLAMA_ARG_CHAT_TEMPLATE` gives it the
    model's own turn format, and the reply holds no marker."""
    assert "tokenizer.chat_template" not in gguf_keys(require("model"))
    plain = ollama(env=ONE_THREAD)
    status, shown = plain.api(SHOW_PATH, {"model": MODEL})
    assert status == 200 and shown["template"] == "{{ .Prompt }}", shown  # Ollama's default
    assert "stop" not in (shown.get("parameters") or ""), shown
    fallback = chat_reply(plain)
    assert "<|im_end|>" in template_markers(fallback), fallback
    assert "missing tokenizer.chat_template" in plain.log_text()
    plain.stop()
    given = ollama(env=ONE_THREAD | CHAT_TEMPLATE_ENV)
    reply = chat_reply(given)
    assert given.runner().environ().get("LLAMA_ARG_CHAT_TEMPLATE") == GEMMA_CHAT_TEMPLATE
    assert reply.strip() and not template_markers(reply), reply
    print(f"ChatML fallback: {fallback!r}\nwith the Gemma template: {reply!r}")


HISTORY = " ".join(f"Note {i}: the number {i} is {('odd', 'even')[i % 2 == 0]}." for i in range(30))


def _chat(server: Ollama, messages: list[dict[str, str]], stream: bool = False) -> dict[str, Any]:
    """The final object of a chat (streamed: its last NDJSON line)."""
    body = {
        "model": TUNED,
        "messages": messages,
        "stream": stream,
        "options": {"num_predict": 1, "temperature": 0, "seed": 1},
    }
    status, answer = server.api("/api/chat", body)
    assert status == 200, answer
    if stream:
        assert isinstance(answer, str)
        answer = json.loads(answer.strip().splitlines()[-1])
    assert isinstance(answer, dict) and answer["done"] is True
    return answer


def test_prompt_eval_count_includes_cached_tokens(tuned: Ollama) -> None:
    """v0.34.4: `prompt_eval_count` counts the whole prompt, cached tokens
    included (llama-server's cache_n + prompt_n), `prompt_eval_cached_count`
    the cached ones, and `prompt_eval_duration` times only the evaluated ones.
    The same prompt sent again after another one reports the same count with
    a different cached count: the child restores earlier prompts from its
    host-memory prompt cache (--cache-ram), not only the slot's last one."""
    system = {"role": "system", "content": "You answer in one word."}
    history = [system, {"role": "user", "content": HISTORY}]
    turn = [*history, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "31?"}]
    rewritten = [{"role": "system", "content": "You answer politely."}, *turn[1:]]
    first = _chat(tuned, history)
    extended = _chat(tuned, turn)
    other = _chat(tuned, rewritten)
    again = _chat(tuned, turn, stream=True)  # `extended`'s prompt, after another one
    finals = (("first", first), ("extended", extended), ("rewritten", other), ("again", again))
    for _, final in finals:
        assert isinstance(final.get("prompt_eval_cached_count"), int), final
    print(
        "ollama prompt cache: "
        + "; ".join(
            f"{name} count {f['prompt_eval_count']} cached {f['prompt_eval_cached_count']} "
            f"in {f['prompt_eval_duration'] / 1e6:.0f} ms"
            for name, f in finals
        )
    )
    assert first["prompt_eval_count"] > 200 and first["prompt_eval_cached_count"] < 10
    # Extended: what the first one read came from the cache, and is still counted.
    assert extended["prompt_eval_cached_count"] >= first["prompt_eval_count"] - 5
    assert extended["prompt_eval_count"] > first["prompt_eval_count"]
    # The rewritten start could reuse (next to) nothing.
    assert other["prompt_eval_cached_count"] < 10
    # The same prompt counts the same, whatever came from the cache.
    assert again["prompt_eval_count"] == extended["prompt_eval_count"]
    assert again["prompt_eval_cached_count"] > other["prompt_eval_cached_count"]
    # Only the evaluated tokens are timed: the extended prompt's few new tokens
    # took a fraction of the first one's time.
    assert extended["prompt_eval_duration"] * 3 < first["prompt_eval_duration"]
