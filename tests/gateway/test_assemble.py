"""Assembling one response from the engine's stream, and reading its timings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.engines.llama_server import timing as llama_server_timing
from localmodel.engines.ollama import timing as ollama_timing
from localmodel.gateway.assemble import OllamaAssembler, OpenAIAssembler, StreamWatcher
from localmodel.gateway.routes import Kind
from localmodel.gateway.stream import (
    DONE,
    LineSplitter,
    StreamError,
    decode_event,
    sse_data,
)
from localmodel.gateway_contract.timing import EngineTiming

# Each engine's own reader (engines/<name>/timing.py): the Ollama API's routes
# here carry Ollama's final object, the OpenAI-compatible ones llama-server's
# `usage` and `timings`.
OLLAMA = ollama_timing
LLAMA_SERVER = llama_server_timing


def timing_from_openai(usage: dict[str, object] | None, timings: dict[str, object] | None,
                       reason: str | None) -> EngineTiming:
    """llama-server's answer carrying these `usage` and `timings`."""
    return llama_server_timing.timing({"usage": usage, "timings": timings}, reason)


FINAL = {
    "model": "m",
    "created_at": "2026-01-01T00:00:00Z",
    "done": True,
    "done_reason": "stop",
    "total_duration": 3_000_000_000,
    "load_duration": 100_000_000,
    "prompt_eval_count": 50,
    "prompt_eval_duration": 500_000_000,
    "eval_count": 20,
    "eval_duration": 2_000_000_000,
}


def test_ollama_timing_fields_are_nanoseconds() -> None:
    timing = ollama_timing.final_timing(FINAL)
    # No prompt_eval_cached_count: how many were cached is not known.
    assert timing == EngineTiming(50, 0.5, 20, 2.0, 0.1, "stop", prompt_total=50)
    assert timing.prefill_tokens_per_second == 100.0
    assert timing.decode_tokens_per_second == 10.0


@pytest.mark.parametrize(
    ("final", "total", "cached", "evaluated"),
    [
        # Ollama 0.34.4: prompt_eval_count is the whole prompt, cached included.
        ({"prompt_eval_count": 50, "prompt_eval_cached_count": 30}, 50, 30, 20),
        ({"prompt_eval_count": 50, "prompt_eval_cached_count": 0}, 50, 0, 50),
        ({"prompt_eval_count": 50}, 50, None, None),  # older releases: not said
        ({}, None, None, None),
        ({"prompt_eval_count": "50", "prompt_eval_cached_count": True}, None, None, None),
    ],
)
def test_ollama_prompt_cache_accounting(
    final: dict[str, object], total: int | None, cached: int | None, evaluated: int | None
) -> None:
    timing = ollama_timing.final_timing({**FINAL, **final} if final else {"done": True})
    assert (timing.prompt_total, timing.prompt_cached, timing.prompt_evaluated) == (
        total, cached, evaluated,
    )
    # Prefill speed is the evaluated tokens over the time they took.
    assert timing.prompt_tokens == (evaluated if evaluated is not None else total)


@pytest.mark.parametrize(
    ("usage", "timings", "total", "cached", "evaluated"),
    [
        # llama-server: timings say both parts.
        (None, {"prompt_n": 7, "cache_n": 93, "prompt_ms": 10.0}, 100, 93, 7),
        ({"prompt_tokens": 100}, {"prompt_n": 7, "cache_n": 93}, 100, 93, 7),
        # OpenAI usage with its details (Ollama's /v1, llama-server's usage).
        ({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 60}}, None, 100, 60, 40),
        ({"prompt_tokens": 100}, None, 100, None, None),
        (None, {"prompt_n": 7}, None, None, None),  # a build without cache_n
        (None, None, None, None, None),
    ],
)
def test_openai_prompt_cache_accounting(
    usage: dict[str, object] | None,
    timings: dict[str, object] | None,
    total: int | None,
    cached: int | None,
    evaluated: int | None,
) -> None:
    timing = timing_from_openai(usage, timings, "stop")
    assert (timing.prompt_total, timing.prompt_cached, timing.prompt_evaluated) == (
        total, cached, evaluated,
    )


def test_llama_server_timings_are_milliseconds_and_win_over_usage() -> None:
    timing = timing_from_openai(
        {"prompt_tokens": 60, "completion_tokens": 20},
        {"prompt_n": 40, "prompt_ms": 200.0, "predicted_n": 20, "predicted_ms": 1000.0},
        "stop",
    )
    assert timing == EngineTiming(40, 0.2, 20, 1.0, None, "stop", prompt_total=60)
    assert timing.prefill_tokens_per_second == 200.0


def test_zero_durations_give_no_rate() -> None:
    assert EngineTiming(10, 0.0, 5, None).prefill_tokens_per_second is None


def test_ollama_generate_assembles_the_final_object_with_the_whole_response() -> None:
    asm = OllamaAssembler(Kind.GENERATE, 10_000, OLLAMA)
    for piece in ["Hel", "lo", "!"]:
        asm.feed({"model": "m", "created_at": "t", "response": piece, "done": False})
    asm.feed({**FINAL, "response": "", "context": [1, 2]})
    out = asm.result()
    assert out == {**FINAL, "response": "Hello!", "context": [1, 2]}
    assert asm.timing() == ollama_timing.final_timing(FINAL)


def test_ollama_chat_assembles_message_thinking_and_tool_calls() -> None:
    asm = OllamaAssembler(Kind.CHAT, 10_000, OLLAMA)
    asm.feed({"message": {"role": "assistant", "content": "", "thinking": "hmm"}, "done": False})
    asm.feed({"message": {"role": "assistant", "content": "Hi"}, "done": False})
    call = {"function": {"name": "f", "arguments": {"x": 1}}}
    asm.feed({"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "done": False})
    asm.feed({**FINAL, "message": {"role": "assistant", "content": ""}})
    out = asm.result()
    assert out["message"] == {
        "role": "assistant",
        "content": "Hi",
        "thinking": "hmm",
        "tool_calls": [call],
    }
    assert out["done_reason"] == "stop"
    assert out["eval_count"] == 20


def test_ollama_stream_without_final_object_is_an_error() -> None:
    asm = OllamaAssembler(Kind.GENERATE, 10_000, OLLAMA)
    asm.feed({"response": "x", "done": False})
    with pytest.raises(StreamError, match="final"):
        asm.result()


def test_ollama_error_object_is_reported() -> None:
    asm = OllamaAssembler(Kind.GENERATE, 10_000, OLLAMA)
    asm.feed({"error": "model crashed"})
    assert asm.finished and asm.error == "model crashed"


def test_assembly_is_bounded() -> None:
    asm = OllamaAssembler(Kind.GENERATE, 10, OLLAMA)
    asm.feed({"response": "12345", "done": False})
    with pytest.raises(StreamError, match="exceeds"):
        asm.feed({"response": "678901", "done": False})


def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "id": "c1",
        "created": 7,
        "model": "g",
        "object": "chat.completion.chunk",
        "system_fingerprint": "b1",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


def test_openai_chat_assembles_a_chat_completion_with_usage_and_timings() -> None:
    asm = OpenAIAssembler(Kind.OPENAI_CHAT, 10_000, LLAMA_SERVER)
    asm.feed(chunk({"role": "assistant", "content": None}))
    asm.feed(chunk({"content": "Hel"}))
    asm.feed(chunk({"content": "lo"}))
    asm.feed(chunk({}, "stop"))
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    timings = {"prompt_n": 5, "prompt_ms": 10.0, "predicted_n": 2, "predicted_ms": 40.0}
    asm.feed({"id": "c1", "choices": [], "usage": usage, "timings": timings})
    asm.feed(DONE)
    out = asm.result()
    assert out == {
        "id": "c1",
        "object": "chat.completion",
        "created": 7,
        "model": "g",
        "system_fingerprint": "b1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
        "timings": timings,
    }
    assert asm.timing().decode_tokens_per_second == 50.0


def test_openai_chat_merges_streamed_tool_call_pieces() -> None:
    asm = OpenAIAssembler(Kind.OPENAI_CHAT, 10_000, LLAMA_SERVER)
    asm.feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call1",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"a"'},
                    }
                ]
            }
        )
    )
    asm.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}))
    asm.feed(chunk({}, "tool_calls"))
    message = asm.result()["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}
    ]


def test_openai_completion_assembles_text_and_estimates_usage_when_absent() -> None:
    asm = OpenAIAssembler(Kind.OPENAI_COMPLETION, 10_000, LLAMA_SERVER)
    for text in ["a", "b", "c"]:
        asm.feed(
            {
                "id": "x",
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": None}],
            }
        )
    asm.feed({"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    out = asm.result()
    assert out["object"] == "text_completion"
    assert out["choices"] == [
        {"index": 0, "text": "abc", "logprobs": None, "finish_reason": "length"}
    ]
    assert out["usage"] == {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3}


def test_openai_stream_cut_before_finish_is_an_error() -> None:
    asm = OpenAIAssembler(Kind.OPENAI_CHAT, 10_000, LLAMA_SERVER)
    asm.feed(chunk({"content": "x"}))
    with pytest.raises(StreamError, match="finish_reason"):
        asm.result()


def test_openai_error_event() -> None:
    asm = OpenAIAssembler(Kind.OPENAI_CHAT, 10_000, LLAMA_SERVER)
    asm.feed({"error": {"message": "context full", "code": 400}})
    assert asm.error == "context full"


@pytest.mark.parametrize(
    ("line", "payload"),
    [
        (b"data: {}", b"{}"),
        (b"data:{}", b"{}"),
        (b": keepalive", None),
        (b"event: x", None),
        (b"", None),
    ],
)
def test_sse_data_lines(line: bytes, payload: bytes | None) -> None:
    assert sse_data(line) == payload


def test_sse_done_sentinel() -> None:
    assert decode_event(b"[DONE]") is DONE
    with pytest.raises(StreamError):
        decode_event(b"{not json")


@given(
    st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=20),
    st.lists(st.integers(min_value=1, max_value=17), min_size=1, max_size=5),
)
def test_line_splitter_recovers_lines_from_any_chunking(
    lines: list[bytes], sizes: list[int]
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    splitter = LineSplitter()
    out: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        out.extend(splitter.feed(data[pos : pos + step]))
        pos += step
        i += 1
    assert out == [line.rstrip(b"\r") for line in lines]
    assert splitter.flush() == b""


def test_line_splitter_limit() -> None:
    splitter = LineSplitter(max_line=8)
    with pytest.raises(StreamError):
        splitter.feed(b"x" * 9)


def test_watcher_reads_ollama_final_timing_from_relayed_bytes() -> None:
    watcher = StreamWatcher(Kind.CHAT, OLLAMA)
    data = b"".join(
        json.dumps(o, separators=(",", ":")).encode() + b"\n"
        for o in [{"message": {"content": "a"}, "done": False}, FINAL]
    )
    for i in range(0, len(data), 7):
        watcher.feed(data[i : i + 7])
    watcher.close()
    assert watcher.final_seen
    assert watcher.timing == ollama_timing.final_timing(FINAL)


def test_watcher_reads_sse_timings_and_errors() -> None:
    watcher = StreamWatcher(Kind.OPENAI_CHAT, LLAMA_SERVER)
    timings = {"prompt_n": 4, "prompt_ms": 8.0, "predicted_n": 3, "predicted_ms": 30.0}
    watcher.feed(b"data: " + json.dumps(chunk({"content": "x"})).encode() + b"\n\n")
    last = chunk({}, "stop") | {"timings": timings}
    watcher.feed(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
    assert watcher.final_seen
    assert watcher.timing == EngineTiming(4, 0.008, 3, 0.03, None, "stop")
    watcher.feed(b'data: {"error": {"message": "boom"}}\n\n')
    assert watcher.error == "boom"


@given(st.lists(st.text(max_size=12), max_size=30))
def test_ollama_assembly_is_the_concatenation_of_the_stream(pieces: list[str]) -> None:
    asm = OllamaAssembler(Kind.CHAT, 100_000, OLLAMA)
    for piece in pieces:
        asm.feed({"message": {"role": "assistant", "content": piece}, "done": False})
    asm.feed({**FINAL, "message": {"role": "assistant", "content": ""}})
    assert asm.result()["message"]["content"] == "".join(pieces)


@given(st.lists(st.text(max_size=12), max_size=30), st.sampled_from(["stop", "length"]))
def test_openai_assembly_is_the_concatenation_of_the_stream(pieces: list[str], reason: str) -> None:
    asm = OpenAIAssembler(Kind.OPENAI_CHAT, 100_000, LLAMA_SERVER)
    for piece in pieces:
        asm.feed(chunk({"content": piece}))
    asm.feed(chunk({}, reason))
    asm.feed(DONE)
    out = asm.result()
    assert out["choices"][0]["message"]["content"] == "".join(pieces)
    assert out["choices"][0]["finish_reason"] == reason


def test_watcher_keeps_no_text_even_on_the_lines_it_reads() -> None:
    """The watcher reads final lines through an assembler that keeps nothing,
    so a relayed stream of any size costs it no memory and hits no limit."""
    watcher = StreamWatcher(Kind.OPENAI_CHAT, LLAMA_SERVER)
    big = chunk({"content": "x" * 100_000, "tool_calls": [{"index": 0, "id": "t"}]}, "stop")
    watcher.feed(b"data: " + json.dumps(big).encode() + b"\n\ndata: [DONE]\n\n")
    assert watcher.final_seen and watcher.error is None
    ollama = StreamWatcher(Kind.GENERATE, OLLAMA)
    ollama.feed(json.dumps({**FINAL, "response": "y" * 100_000}).encode() + b"\n")
    assert ollama.timing == ollama_timing.final_timing(FINAL)
