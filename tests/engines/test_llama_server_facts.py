"""Engine facts about llama.cpp's llama-server, shown against the real one
(built by hack/build-engines.sh; docs/engine-facts.md names the sources).

One thread everywhere except the default-thread test, which lets the engine
pick (that is the fact under test) and stops it as soon as it has said how
many threads it took.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.engines.real_ollama import cpu_seconds, wait_idle
from tests.harness.cgroup import CgroupUnavailableError, cpu_quota_cgroup
from tests.harness.engines import (
    CHAT_TEMPLATE_ENV,
    START_TIMEOUT,
    LlamaServer,
    gguf_keys,
    llama_server,
    require,
    start_llama_server,
    template_markers,
)

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

CLEAN_ENV = {"PATH": "/usr/bin:/bin"}  # nothing of the test runner's environment


def serve(workdir: Path, *args: str, preexec: Callable[[], None] | None = None) -> LlamaServer:
    """llama-server with `args`, started, not waited for."""
    return start_llama_server(workdir, ["--no-warmup", *args], env=CLEAN_ENV, preexec=preexec)


def running(workdir: Path, *args: str) -> contextlib.AbstractContextManager[LlamaServer]:
    return llama_server(workdir, ["--no-warmup", *args], env=CLEAN_ENV)


def test_quantized_v_cache_without_flash_attention_fails(tmp_path: Path) -> None:
    engine = serve(
        tmp_path / "off", "-t", "1", "-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"
    )
    try:
        rc = engine.process.wait(timeout=START_TIMEOUT)
    finally:
        engine.stop()
    assert rc != 0
    assert "quantized V cache requires flash_attn" in engine.log_text()
    # Control: the same cache with flash attention on loads and serves.
    with running(
        tmp_path / "on", "-t", "1", "-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"
    ):
        pass


def _threads_taken(engine: LlamaServer) -> int:
    # "system_info: n_threads = N" in older builds, "threadpool init, n_threads = N" in newer.
    pattern = re.compile(r"(?:system_info:|threadpool init,) n_threads = (\d+)")
    found: list[int] = []

    def said() -> bool:
        found[:] = [int(n) for n in pattern.findall(engine.log_text())]
        return bool(found)

    try:
        engine.process.wait_ready("llama-server to say its thread count", said, START_TIMEOUT)
    finally:
        engine.stop()
    return found[0]


def test_default_threads_ignore_cpuset_and_quota(tmp_path: Path) -> None:
    host = os.cpu_count() or 1
    assert host >= 2, "needs more than one host CPU to tell a restricted default apart"
    assert len(os.sched_getaffinity(0)) == host, "the test runner itself must see every CPU"

    # One allowed CPU (cpuset / affinity): the default still counts the host.
    engine = serve(tmp_path / "cpuset", "-c", "512", preexec=lambda: os.sched_setaffinity(0, {0}))
    assert psutil.Process(engine.process.pid).cpu_affinity() == [0]
    assert _threads_taken(engine) == host

    # A one-CPU cgroup quota: the default still counts the host.
    try:
        with cpu_quota_cgroup(cpus=1) as group:
            taken = _threads_taken(serve(tmp_path / "quota", "-c", "512", preexec=group.join))
    except CgroupUnavailableError as exc:
        pytest.fail(str(exc), pytrace=False)
    assert taken == host


def test_non_streaming_caller_that_leaves_stops_llama_server(tmp_path: Path) -> None:
    """One slot, nothing else running: the abandoned non-streaming request is
    cancelled by llama-server's connection polling (about once a second)."""
    with running(tmp_path / "cancel", "-t", "1", "-c", "8192", "-np", "1") as server:
        port = server.port
        engine = next(
            p
            for p in psutil.process_iter(["name"])
            if p.info["name"] == "llama-server" and f"--port {port}" in " ".join(p.cmdline())
        )
        body = json.dumps(
            {"prompt": "Once upon a time", "n_predict": 8000, "ignore_eos": True, "stream": False}
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        start = cpu_seconds(engine)
        deadline = time.monotonic() + 60
        while cpu_seconds(engine) - start < 1.0:  # well into decoding
            assert time.monotonic() < deadline, "llama-server never got busy"
            time.sleep(0.1)
        sock.close()
        # 8000 tokens on one thread take minutes; stopping within seconds is cancellation.
        idle_after = wait_idle(engine, timeout=15, window=0.5, busy=0.05)
        print(f"llama-server non-streaming disconnect: idle within {idle_after:.1f} s")


CHAT = {"messages": [{"role": "user", "content": "Say hello in three words."}]}


def chat_reply(server: LlamaServer) -> str:
    status, body = server.api(
        "/v1/chat/completions", {**CHAT, "max_tokens": 24, "temperature": 0, "seed": 1}
    )
    assert status == 200, body
    return str(body["choices"][0]["message"]["content"])


def test_a_gguf_without_a_chat_template_gets_chatml_unless_one_is_given(tmp_path: Path) -> None:
    """The cached GGUF carries no `tokenizer.chat_template`: llama-server formats
    chat as ChatML, whose markers are plain text to Gemma, and the reply holds
    a literal `<|im_end|>`. `LLAMA_ARG_CHAT_TEMPLATE` (a Jinja template) gives
    it the model's own turn format, and the reply holds no marker."""
    assert "tokenizer.chat_template" not in gguf_keys(require("model"))
    with running(tmp_path / "fallback", "-t", "1", "-c", "1024") as server:
        status, applied = server.api("/apply-template", CHAT)
        assert status == 200 and applied["prompt"].startswith("<|im_start|>user\n"), applied
        fallback = chat_reply(server)
    assert "<|im_end|>" in template_markers(fallback), fallback
    with llama_server(tmp_path / "gemma", ["--no-warmup", "-t", "1", "-c", "1024"],
                      env=CLEAN_ENV | CHAT_TEMPLATE_ENV) as server:
        status, applied = server.api("/apply-template", CHAT)
        assert applied["prompt"] == (
            "<start_of_turn>user\nSay hello in three words.<end_of_turn>\n<start_of_turn>model\n"
        ), applied
        reply = chat_reply(server)
    assert reply.strip() and not template_markers(reply), reply
    print(f"ChatML fallback: {fallback!r}\nwith the Gemma template: {reply!r}")


# A history long enough that its prefill is measurable on one thread.
HISTORY = " ".join(f"Note {i}: the number {i} is {('odd', 'even')[i % 2 == 0]}." for i in range(40))
SYSTEM = {"role": "system", "content": "You answer in one word."}
REWRITTEN_SYSTEM = {"role": "system", "content": "You answer briefly and politely."}


def _sse_final(text: str) -> dict[str, Any]:
    """The stream's `timings` and `usage`, from its data lines."""
    final: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            for key in ("timings", "usage"):
                if key in event:
                    final[key] = event[key]
    return final


def test_timings_say_how_much_of_the_prompt_came_from_the_cache(tmp_path: Path) -> None:
    """`timings.cache_n` is the prompt tokens reused from the slot's cache,
    `prompt_n` those evaluated, `prompt_ms` the evaluation's time; usage's
    prompt_tokens is their sum and prompt_tokens_details.cached_tokens is
    cache_n, streamed (as the gateway asks) or not."""
    history = [SYSTEM, {"role": "user", "content": HISTORY}]
    turn = [*history, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "41?"}]
    rewritten = [REWRITTEN_SYSTEM, *turn[1:]]
    with running(tmp_path, "-t", "1", "-c", "2048", "-np", "1") as engine:

        def chat(messages: list[dict[str, str]], stream: bool = False) -> dict[str, Any]:
            body: dict[str, Any] = {"messages": messages, "max_tokens": 1, "temperature": 0}
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            status, answer = engine.api("/v1/chat/completions", body)
            assert status == 200, answer
            return _sse_final(answer) if stream else dict(answer)

        first, second, third = chat(history), chat(turn, stream=True), chat(rewritten)
    for answer in (first, second, third):
        t, usage = answer["timings"], answer["usage"]
        assert t["cache_n"] + t["prompt_n"] == usage["prompt_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
    ft, st, tt = first["timings"], second["timings"], third["timings"]
    print(
        f"llama-server prompt cache: first {ft['cache_n']}+{ft['prompt_n']} in "
        f"{ft['prompt_ms']:.0f} ms; extended {st['cache_n']}+{st['prompt_n']} in "
        f"{st['prompt_ms']:.0f} ms; rewritten {tt['cache_n']}+{tt['prompt_n']} in "
        f"{tt['prompt_ms']:.0f} ms"
    )
    assert ft["prompt_n"] > 200
    # The extended prompt reused what the first one read: only the new turn was evaluated.
    assert st["cache_n"] >= ft["prompt_n"] - 5 and st["prompt_n"] < 60
    # The rewritten system prompt changed the start: nearly all of it read again.
    assert tt["cache_n"] < 10 and tt["prompt_n"] > st["cache_n"]
    # Each evaluation reports its time (the gateway's ledger reads it); how much
    # faster the cached turn is is a timing claim for a benchmark, not a test on
    # a shared machine (printed above: 10x on a quiet machine here, 2.8x under CI load).
    assert all(t["prompt_ms"] > 0 for t in (ft, st, tt))
