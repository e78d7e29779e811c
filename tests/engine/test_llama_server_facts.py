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

import psutil
import pytest

from tests.engine.real_ollama import cpu_seconds, wait_idle
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

pytestmark = pytest.mark.engine

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
