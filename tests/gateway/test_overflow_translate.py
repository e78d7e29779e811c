"""The overflow's pure parts: the request sent there, the answer told back in
Ollama's shape, the breaker, and the settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.gateway.config import ConfigError, parse_config
from localmodel.gateway.overflow import (
    OllamaReply,
    OverflowBreaker,
    Untranslatable,
    overflow_request,
    scrub,
)
from localmodel.gateway.routes import ROUTES, Kind
from localmodel.gateway.stream import StreamError
from localmodel.gateway_contract import GatewayConfig

CONFIG = GatewayConfig(
    overflow_url="https://far.example/v1", overflow_model="big", max_tokens=100, threads=2
)
ROUTE = {r.path: r for r in ROUTES}


def sent(path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any], bool, bool]:
    req = overflow_request(ROUTE[path], json.dumps(body).encode(), CONFIG)
    return req.path, json.loads(req.body), req.caller_streams, req.ollama


def test_openai_body_keeps_the_callers_fields_with_model_replaced_and_cap() -> None:
    path, body, streams, ollama = sent(
        "/v1/chat/completions",
        {"model": "qwen3", "messages": [{"role": "user", "content": "x"}], "max_tokens": 500},
    )
    assert (path, streams, ollama) == ("/chat/completions", False, False)
    assert body == {
        "model": "big",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100,
    }
    path, body, streams, _ = sent("/v1/completions", {"prompt": "x", "stream": True})
    assert (path, streams, body["stream"], body["max_tokens"]) == ("/completions", True, True, 100)
    assert "stream_options" not in body  # a streaming caller keeps its own choice


def test_ollama_chat_becomes_a_chat_completion() -> None:
    path, body, streams, ollama = sent(
        "/api/chat",
        {
            "model": "qwen3",
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"num_ctx": 4096, "num_thread": 8, "temperature": 0.5, "stop": ["\n"]},
            "keep_alive": "5m",
            "think": True,
        },
    )
    assert (path, streams, ollama) == ("/chat/completions", True, True)
    assert body == {
        "model": "big",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "stop": ["\n"],
        "max_tokens": 100,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_ollama_generate_becomes_system_and_user_messages() -> None:
    schema = {"type": "object"}
    _, body, streams, _ = sent(
        "/api/generate",
        {
            "prompt": "p",
            "system": "s",
            "stream": False,
            "format": schema,
            "options": {"num_predict": 7},
        },
    )
    assert not streams
    assert body["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "p"},
    ]
    assert body["max_tokens"] == 7
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/embed", {"input": "x"}),
        ("/v1/embeddings", {"input": "x"}),
        ("/api/generate", {"prompt": "x", "raw": True}),
        ("/api/generate", {"prompt": "x", "context": [1, 2]}),
        ("/api/generate", {"prompt": "x", "images": ["AAAA"]}),
        ("/api/generate", {"prompt": "x", "suffix": "y"}),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["AA"]}]}),
        ("/api/chat", {"messages": [{"role": "tool", "content": "x"}]}),
        ("/api/chat", {"messages": [], "tools": [{"type": "function"}]}),
        ("/api/chat", {"messages": "x"}),
        ("/api/chat", {"messages": [], "format": "yaml"}),
    ],
)
def test_what_a_chat_completion_cannot_carry_stays_local(path: str, body: dict[str, Any]) -> None:
    with pytest.raises(Untranslatable):
        overflow_request(ROUTE[path], json.dumps(body).encode(), CONFIG)


def sse(*events: dict[str, Any] | str) -> bytes:
    out = b""
    for e in events:
        out += b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
    return out


def delta(content: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def test_streamed_chat_completion_becomes_ollama_ndjson() -> None:
    reply = OllamaReply(Kind.CHAT, "big", "2026-01-01T00:00:00Z")
    out = reply.feed(sse(delta("He"), delta("llo"), delta("", "length"), USAGE, "[DONE]"))
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["message"]["content"] for o in objs] == ["He", "llo", ""]
    assert objs[-1] == {
        "model": "big",
        "created_at": "2026-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "length",
        "prompt_eval_count": 3,
        "eval_count": 2,
    }
    assert reply.close() == b""


def test_generate_stream_without_done_marker_ends_at_close() -> None:
    reply = OllamaReply(Kind.GENERATE, "big", "t")
    assert json.loads(reply.feed(sse(delta("x"))))["response"] == "x"
    reply.feed(sse(delta("", "stop")))
    final = json.loads(reply.close())
    assert (final["done"], final["done_reason"], final["response"]) == (True, "stop", "")


def test_stream_that_ends_early_or_reports_an_error_is_a_stream_error() -> None:
    reply = OllamaReply(Kind.CHAT, "big", "t")
    reply.feed(sse(delta("x")))
    with pytest.raises(StreamError, match="ended"):
        reply.close()
    with pytest.raises(StreamError, match="boom"):
        OllamaReply(Kind.CHAT, "big", "t").feed(sse({"error": {"message": "boom"}}))


def test_whole_chat_completion_becomes_the_ollama_object() -> None:
    doc = {
        "model": "far-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi", "reasoning_content": "hmm"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    out = OllamaReply(Kind.CHAT, "big", "t").whole(doc)
    assert out["message"] == {"role": "assistant", "content": "Hi", "thinking": "hmm"}
    assert (out["done"], out["eval_count"], out["prompt_eval_count"]) == (True, 1, 4)
    gen = OllamaReply(Kind.GENERATE, "big", "t").whole(doc)
    assert (gen["response"], gen["thinking"]) == ("Hi", "hmm")
    with pytest.raises(StreamError):
        OllamaReply(Kind.CHAT, "big", "t").whole({"choices": []})


@given(
    st.lists(st.text(min_size=1, max_size=8), max_size=20),
    st.lists(st.integers(min_value=1, max_value=23), min_size=1, max_size=4),
)
def test_translated_stream_is_the_concatenation_under_any_chunking(
    pieces: list[str], sizes: list[int]
) -> None:
    data = sse(*[delta(p) for p in pieces], delta("", "stop"), "[DONE]")
    reply = OllamaReply(Kind.CHAT, "big", "t")
    out = b""
    pos = i = 0
    while pos < len(data):
        out += reply.feed(data[pos : pos + sizes[i % len(sizes)]])
        pos += sizes[i % len(sizes)]
        i += 1
    out += reply.close()
    objs = [json.loads(line) for line in out.splitlines()]
    assert "".join(o["message"]["content"] for o in objs) == "".join(pieces)
    assert [o["done"] for o in objs].count(True) == 1 and objs[-1]["done"]


def test_breaker_backs_off_and_resets() -> None:
    b = OverflowBreaker(base=5, cap=12)
    assert b.allows(0)
    b.failed(100)
    assert not b.allows(104.9) and b.allows(105)
    b.failed(105)
    assert not b.allows(114.9) and b.allows(115)
    b.failed(115)
    assert b.allows(127)  # capped at 12 s
    b.succeeded()
    assert b.allows(0)


def test_scrub() -> None:
    assert scrub("bad key sk-1 given", "sk-1") == "bad key [redacted] given"
    assert scrub("x", "") == "x"
    # The overflow's answer is relayed as bytes, scrubbed the same way.
    assert scrub(b'{"e":"sk-1 sk-1"}', "sk-1") == b'{"e":"[redacted] [redacted]"}'
    assert scrub(b"x", "") == b"x"


def test_overflow_flags_and_the_key_from_the_environment_only() -> None:
    env = {"LOCALMODEL_GATEWAY_OVERFLOW_API_KEY": "sk-secret"}
    config = parse_config(
        [
            "--overflow-url",
            "https://far.example/v1/",
            "--overflow-model",
            "m",
            "--overflow-after",
            "2.5",
        ],
        env,
    )
    assert (config.overflow_url, config.overflow_model, config.overflow_after) == (
        "https://far.example/v1",
        "m",
        2.5,
    )
    assert config.overflow_api_key == "sk-secret"
    assert "sk-secret" not in repr(config)
    with pytest.raises(ConfigError, match="unknown flag"):
        parse_config(["--overflow-api-key", "sk-secret"], {})


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--overflow-url", "https://x/v1"], "overflow-model"),
        (["--overflow-model", "m"], "overflow-url"),
        (["--overflow-url", "ftp://x"], "overflow-url"),
        (
            ["--overflow-url", "https://x/v1", "--overflow-model", "m", "--overflow-after", "-1"],
            "overflow-after",
        ),
    ],
)
def test_bad_overflow_settings_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(argv, {})
    assert err.value.flag == flag
