"""What the gateway changes in a caller's body before it goes upstream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.engines import ollama
from localmodel.gateway.rewrite import (
    RUNNER_OPTIONS,
    BadRequest,
    cap_generation,
    keep_alive_value,
    load_request,
    model_loaded,
    prepare,
    request_deadline,
)
from localmodel.gateway.routes import ROUTES, Route
from localmodel.gateway_contract import GatewayConfig

CONFIG = GatewayConfig(model="qwen3:1.7b", threads=4, context=8192, max_tokens=512)
ROUTE = {r.path: r for r in ROUTES}


def run(path: str, body: Any, config: GatewayConfig = CONFIG) -> tuple[dict[str, Any], bool]:
    prepared = prepare(ROUTE[path], json.dumps(body).encode(), config)
    return json.loads(prepared.body), prepared.caller_streams


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_thread": 32}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_ctx": 2048}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_batch": 64}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        (
            {"num_gpu": 99, "use_mmap": False},
            {"num_thread": 4, "num_ctx": 8192, "num_predict": 512},
        ),
        ({"num_ctx": 131072}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_predict": 100}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 100}),
        ({"num_predict": -1}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_predict": -2}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        ({"num_predict": 9999}, {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}),
        (
            {"temperature": 0.2},
            {"temperature": 0.2, "num_thread": 4, "num_ctx": 8192, "num_predict": 512},
        ),
    ],
)
def test_ollama_generation_gets_the_owned_options(
    path: str, options: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    body: dict[str, Any] = {"model": "qwen3:1.7b", "prompt": "hi"}
    if options is not None:
        body["options"] = options
    out, _ = run(path, body)
    assert out["options"] == expected


@pytest.mark.parametrize(
    ("path", "body", "caller_streams"),
    [
        ("/api/generate", {"prompt": "x"}, True),  # Ollama streams unless told not to
        ("/api/generate", {"prompt": "x", "stream": False}, False),
        ("/api/chat", {"messages": [], "stream": True}, True),
        ("/v1/chat/completions", {"messages": []}, False),  # OpenAI does not by default
        ("/v1/completions", {"prompt": "x", "stream": True}, True),
    ],
)
def test_generation_always_streams_upstream(
    path: str, body: dict[str, Any], caller_streams: bool
) -> None:
    out, streams = run(path, body)
    assert out["stream"] is True
    assert streams is caller_streams


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat", "/api/embed"])
@pytest.mark.parametrize("callers", [None, 0, "0", "0s", "10m", -1, 1.5, "junk", [], {"a": 1}])
def test_keep_alive_is_the_pods_whatever_the_caller_sends(path: str, callers: object) -> None:
    """A caller's keep_alive 0 would unload the model after its own request:
    the engine always gets the pod's (a number as a number)."""
    body = {"prompt": "x", "input": "x", "messages": []}
    if callers is not None:
        body["keep_alive"] = callers
    prepared = prepare(ROUTE[path], json.dumps(body).encode(), CONFIG)
    assert json.loads(prepared.body)["keep_alive"] == -1
    # Counted as rewritten when the caller asked for something else.
    assert ("keep_alive" in prepared.rewritten) is (callers not in (None, -1))
    pod_5m = GatewayConfig(model="m", keep_alive="5m")
    out = json.loads(prepare(ROUTE[path], json.dumps(body).encode(), pod_5m).body)
    assert out["keep_alive"] == "5m"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
@pytest.mark.parametrize("callers", [0, "0s", "10m"])
def test_a_callers_keep_alive_never_reaches_the_engine_on_the_openai_routes(
    path: str, callers: object
) -> None:
    body = {"prompt": "x", "input": "x", "messages": [], "keep_alive": callers}
    prepared = prepare(ROUTE[path], json.dumps(body).encode(), CONFIG)
    assert "keep_alive" not in json.loads(prepared.body)
    assert prepared.rewritten == ("keep_alive",)


@pytest.mark.parametrize(
    ("setting", "value"), [("-1", -1), ("300", 300), ("1.5", 1.5), ("5m", "5m")]
)
def test_keep_alive_value(setting: str, value: object) -> None:
    assert keep_alive_value(setting) == value


def test_model_defaults_to_the_served_model() -> None:
    out, _ = run("/api/chat", {"messages": []})
    assert out["model"] == "qwen3:1.7b"
    out, _ = run("/v1/embeddings", {"input": "x", "model": "other"})
    assert out["model"] == "other"


def test_embed_gets_threads_and_context_but_no_generation_cap() -> None:
    out, _ = run("/api/embed", {"input": "x"})
    assert out["options"] == {"num_thread": 4, "num_ctx": 8192}
    assert "stream" not in out


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, {"max_tokens": 512}),
        ({"max_tokens": 10}, {"max_tokens": 10}),
        ({"max_tokens": 100000}, {"max_tokens": 512}),
        ({"max_tokens": None}, {"max_tokens": 512}),
        ({"max_completion_tokens": 4096}, {"max_completion_tokens": 512}),
        ({"n_predict": -1}, {"n_predict": 512}),
    ],
)
def test_openai_generation_length_is_capped(body: dict[str, Any], expected: dict[str, Any]) -> None:
    out, _ = run("/v1/chat/completions", {"messages": [], **body})
    for key, value in expected.items():
        assert out[key] == value


def test_openai_non_streaming_caller_asks_upstream_for_usage() -> None:
    out, _ = run("/v1/chat/completions", {"messages": []})
    assert out["stream_options"] == {"include_usage": True}
    out, _ = run("/v1/chat/completions", {"messages": [], "stream": True})
    assert "stream_options" not in out  # a streaming caller keeps its own choice


def test_without_threads_or_context_the_callers_runner_options_are_dropped() -> None:
    """The engine then keeps the values it loaded with: no reload."""
    config = GatewayConfig(max_tokens=64)
    out, _ = run(
        "/api/generate", {"prompt": "x", "options": {"num_thread": 3, "num_ctx": 99}}, config
    )
    assert out["options"] == {"num_predict": 64}


@pytest.mark.parametrize(
    ("options", "rewritten"),
    [
        (None, ()),
        ({"num_thread": 4, "num_ctx": 8192}, ()),  # already the pod's values
        ({"num_ctx": 2048, "temperature": 0.1}, ("num_ctx",)),
        ({"num_batch": 64, "num_thread": 8}, ("num_batch", "num_thread")),
        (
            {"num_gpu": 0, "main_gpu": 0, "use_mmap": True, "use_mlock": True},
            (
                "num_gpu",
                "main_gpu",
                "use_mmap",
                "use_mlock",
            ),
        ),
    ],
)
def test_rewritten_runner_options_are_reported(
    options: dict[str, Any] | None, rewritten: tuple[str, ...]
) -> None:
    body: dict[str, Any] = {"prompt": "x"}
    if options is not None:
        body["options"] = options
    prepared = prepare(ROUTE["/api/generate"], json.dumps(body).encode(), CONFIG)
    assert prepared.rewritten == rewritten
    sent = json.loads(prepared.body)["options"]
    assert not set(RUNNER_OPTIONS) - {"num_thread", "num_ctx"} & sent.keys()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty"),
        (b"{bad", "malformed JSON"),
        (b"\xff\xfe", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": 3}', "model must be a string"),
        (b'{"options": [1]}', "options must be a JSON object"),
        (b'{"options": {"num_ctx": "big"}}', "options.num_ctx must be a number"),
        (b'{"options": {"num_predict": 1.5}}', "options.num_predict must be an integer"),
        (b'{"stream": "no"}', "stream must be true or false"),
    ],
)
def test_bad_bodies_are_named(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        prepare(ROUTE["/api/generate"], raw, CONFIG)


@given(
    requested=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**7)),
    cap=st.integers(min_value=1, max_value=10**6),
)
def test_cap_generation_never_exceeds_the_cap(requested: int | None, cap: int) -> None:
    value = cap_generation(requested, cap)
    assert 1 <= value <= cap
    if requested is not None and 0 < requested <= cap:
        assert value == requested


@given(
    num_ctx=st.integers(min_value=-10, max_value=10**6),
    num_thread=st.integers(min_value=-10, max_value=512),
)
def test_owned_options_hold_for_any_caller_values(num_ctx: int, num_thread: int) -> None:
    out, _ = run(
        "/api/chat", {"messages": [], "options": {"num_ctx": num_ctx, "num_thread": num_thread}}
    )
    assert out["options"] == {"num_thread": 4, "num_ctx": 8192, "num_predict": 512}


def test_every_route_is_known() -> None:
    paths = {r.path for r in ROUTES}
    assert {
        "/api/generate",
        "/api/chat",
        "/api/embed",
        ollama.TAGS_PATH,
        ollama.SHOW_PATH,
        ollama.PS_PATH,
        ollama.VERSION_PATH,
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    } == paths
    assert all(isinstance(r, Route) for r in ROUTES)


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 600.0), ("", 600.0), ("30", 30.0), ("0.25", 0.25), ("3600", 600.0)],
)
def test_request_deadline_defaults_and_is_capped(header: str | None, expected: float) -> None:
    assert request_deadline(header, 600.0) == expected


@pytest.mark.parametrize("header", ["soon", "0", "-1", "nan"])
def test_bad_request_deadline_is_named(header: str) -> None:
    with pytest.raises(BadRequest, match="X-Request-Timeout"):
        request_deadline(header, 600.0)


def test_load_request_carries_the_owned_settings() -> None:
    assert load_request(CONFIG) == {
        "model": "qwen3:1.7b",
        "keep_alive": -1,
        "options": {"num_thread": 4, "num_ctx": 8192},
        "stream": False,
    }


@pytest.mark.parametrize(
    ("model", "ps", "loaded"),
    [
        ("qwen3:1.7b", {"models": [{"name": "qwen3:1.7b", "model": "qwen3:1.7b"}]}, True),
        ("gemma3", {"models": [{"name": "gemma3:latest"}]}, True),
        ("gemma3:1b", {"models": [{"name": "gemma3:latest"}]}, False),
        ("qwen3:1.7b", {"models": []}, False),
        ("qwen3:1.7b", {}, False),
        ("qwen3:1.7b", [], False),
    ],
)
def test_model_loaded_reads_api_ps(model: str, ps: object, loaded: bool) -> None:
    assert model_loaded(model, ps) is loaded
