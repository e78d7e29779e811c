"""Request rewriting: what the gateway changes in a caller's body, and why. Pure.

The operator owns a few settings because they decide whether the node stays
fast (docs/engine-facts.md): the thread count (oversubscription collapses decode),
the context (memory was sized for it), every other option Ollama loads the
model with (a different value reloads the model for every caller), the
generation cap (an abandoned request must end by itself even if cancellation
regresses in the engine,
llama.cpp#11720/#13262) and keep_alive (weights are loaded once: a caller's
keep_alive never reaches the engine, the pod's replaces it). And every
generation goes upstream as a stream, because only a streaming request is
cancelled reliably when its connection closes (docs/engine-facts.md, Cancellation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localmodel.gateway.ledger import Prompt, prompt_of
from localmodel.gateway.routes import Kind, Route
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.bounds import check_bounds


class BadRequest(ValueError):
    """The caller's body cannot be used; the message names the problem."""


# The options Ollama loads a model with (api/types.go, `Runner`: num_ctx,
# num_batch, num_gpu, main_gpu, use_mmap, num_thread; older releases also
# low_vram, f16_kv, logits_all, vocab_only, use_mlock, numa). A request whose
# value differs from the loaded one makes the scheduler reload the model
# (server/sched.go, needsReload compares the whole Runner struct), so one
# caller's option would cost every caller a reload.
RUNNER_OPTIONS = (
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "numa",
)


@dataclass(frozen=True)
class Prepared:
    """One request as it goes upstream: its body, whether the caller streams, its model, and what
    was rewritten."""

    body: bytes  # what goes upstream
    caller_streams: bool  # whether the caller asked for a stream back
    model: str
    # Runner options (and keep_alive) the caller set to something other than
    # the pod's values.
    rewritten: tuple[str, ...] = ()
    user: object = None  # the OpenAI `user` field, as sent (a caller's name)
    prompt: Prompt | None = None  # for the ledger's rewrite check, when asked for


def pod_runner_options(config: GatewayConfig) -> dict[str, int]:
    """The runner options the pod loads its model with (the rest stay the
    engine's own: the tuned Modelfile's PARAMETERs or Ollama's defaults)."""
    options: dict[str, int] = {}
    if config.threads is not None:
        options["num_thread"] = config.threads
    if config.context is not None:
        options["num_ctx"] = config.context
    return options


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadRequest("malformed JSON: nested deeper than the gateway parses") from None
    except UnicodeDecodeError:
        raise BadRequest("malformed JSON: body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(value, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(value).__name__}")
    return value


def keep_alive_value(setting: str) -> int | float | str:
    """Ollama reads a JSON number as seconds (negative: forever) and a string as
    a Go duration ("5m"); a bare "-1" string would be rejected, so send numbers
    as numbers."""
    try:
        return int(setting)
    except ValueError:
        pass
    try:
        return float(setting)
    except ValueError:
        return setting


def _int_field(container: dict[str, Any], key: str, where: str) -> int | None:
    value = container.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{where}{key} must be a number, got {json.dumps(value)[:40]}")
    if isinstance(value, float) and not value.is_integer():
        raise BadRequest(f"{where}{key} must be an integer, got {value}")
    return int(value)


def _bool_field(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false, got {json.dumps(value)[:40]}")
    return value


def cap_generation(requested: int | None, cap: int) -> int:
    """The caller's generation length within the cap. Absent, negative
    (Ollama: -1 infinite, -2 fill the context) or zero means "as much as
    allowed", which is the cap."""
    if requested is None or requested <= 0:
        return cap
    return min(requested, cap)


def _model(body: dict[str, Any], config: GatewayConfig) -> str:
    model = body.get("model")
    if model is None or model == "":
        if config.model:
            body["model"] = config.model
            return config.model
        return ""
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {json.dumps(model)[:40]}")
    return model


def _ollama_options(
    body: dict[str, Any], config: GatewayConfig, *, generation: bool
) -> tuple[str, ...]:
    """Apply the owned options; returns the runner options the caller had
    set differently (forced to the pod's value, or dropped so the engine keeps
    the value it loaded with)."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("options must be a JSON object")
    owned = pod_runner_options(config)
    rewritten: list[str] = []
    for name in RUNNER_OPTIONS:
        if name in options:
            if name in owned:
                _int_field(options, name, "options.")
            if options[name] != owned.get(name):
                rewritten.append(name)
            del options[name]
    options.update(owned)
    if generation:
        options["num_predict"] = cap_generation(
            _int_field(options, "num_predict", "options."), config.max_tokens
        )
    body["options"] = options
    # keep_alive is the pod's: a caller's 0 would unload the model after its
    # request and cost the next caller a load (any other value, a schedule).
    pod_keep_alive = keep_alive_value(config.keep_alive)
    if body.get("keep_alive") not in (None, pod_keep_alive):
        rewritten.append("keep_alive")
    body["keep_alive"] = pod_keep_alive
    return tuple(rewritten)


def openai_owned(body: dict[str, Any], config: GatewayConfig) -> tuple[str, ...]:
    """The pod's settings in an OpenAI-shaped body for the local engine: the
    generation capped, and a caller's `keep_alive` dropped (the engine keeps
    the pod's: OLLAMA_KEEP_ALIVE). Ollama 0.34.4's OpenAI layer has no such
    field (openai/openai.go, ChatCompletionRequest) and llama-server none at
    all; dropped here so no later release reads it."""
    openai_caps(body, config)
    return _drop_keep_alive(body)


def _drop_keep_alive(body: dict[str, Any]) -> tuple[str, ...]:
    return ("keep_alive",) if body.pop("keep_alive", None) is not None else ()


def openai_caps(body: dict[str, Any], config: GatewayConfig) -> None:
    """Cap the generation length of an OpenAI-shaped body (absent: the cap)."""
    present = False
    for key in ("max_tokens", "max_completion_tokens", "n_predict"):
        if key in body:
            present = True
            body[key] = cap_generation(_int_field(body, key, ""), config.max_tokens)
    if not present:
        body["max_tokens"] = config.max_tokens


def encode(body: dict[str, Any]) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate ("\\ud800" in the caller's JSON) has no UTF-8: sent
        # on escaped, as the caller wrote it; the engine decides.
        return json.dumps(body, separators=(",", ":")).encode()


def metadata_model(raw: bytes, config: GatewayConfig) -> str:
    """A metadata body (POST /api/show) checked as every body is (a JSON
    object within the bounds; BadRequest, TooLarge) and sent on unchanged: the
    model it asks about (Ollama's older clients say `name`), or ""."""
    body = parse_json_object(raw)
    check_bounds(body, config)
    model = body.get("model") or body.get("name")
    return model if isinstance(model, str) else ""


def prepare(
    route: Route, raw: bytes, config: GatewayConfig, *, want_prompt: bool = False
) -> Prepared:
    """Parse and rewrite a caller's body for the upstream engine (`want_prompt`:
    also its prompt's print, for a session's rewrite check)."""
    body = parse_json_object(raw)
    check_bounds(body, config)
    model = _model(body, config)
    caller_streams = False
    rewritten: tuple[str, ...] = ()
    if route.kind in (Kind.GENERATE, Kind.CHAT):
        caller_streams = caller_stream_choice(route, body)
        rewritten = _ollama_options(body, config, generation=True)
        body["stream"] = True
    elif route.kind is Kind.EMBED:
        rewritten = _ollama_options(body, config, generation=False)
    elif route.kind is Kind.OPENAI_EMBED:
        rewritten = _drop_keep_alive(body)
    elif route.kind in (Kind.OPENAI_CHAT, Kind.OPENAI_COMPLETION):
        caller_streams = caller_stream_choice(route, body)
        rewritten = openai_owned(body, config)
        body["stream"] = True
        if not caller_streams:
            # Usage arrives in a last chunk only when asked for; a caller that
            # streams keeps whatever it chose.
            body["stream_options"] = {"include_usage": True}
    return Prepared(
        body=encode(body),
        caller_streams=caller_streams,
        model=model,
        rewritten=rewritten,
        user=body.get("user"),
        prompt=prompt_of(route.kind.value, body) if want_prompt else None,
    )


def caller_stream_choice(route: Route, body: dict[str, Any]) -> bool:
    """Whether the caller wants a stream back: Ollama streams by default, OpenAI does not."""
    return _bool_field(body, "stream", route.is_ollama_native)


def request_deadline(header: str | None, default: float) -> float:
    """X-Request-Timeout in seconds; the configured deadline is also the maximum
    (it guards the node, so a caller cannot ask for more)."""
    if header is None or not header.strip():
        return default
    try:
        value = float(header)
    except ValueError:
        raise BadRequest(f"X-Request-Timeout must be a number of seconds, got {header!r}") from None
    if not value > 0 or value != value:
        raise BadRequest(f"X-Request-Timeout must be > 0 seconds, got {header!r}")
    return min(value, default)


def load_request(config: GatewayConfig) -> dict[str, Any]:
    """The Ollama request that loads the model (a generate with no prompt) with
    the owned settings, so the load uses the right threads and context."""
    return {
        "model": config.model,
        "keep_alive": keep_alive_value(config.keep_alive),
        "options": pod_runner_options(config),
        "stream": False,
    }


def model_loaded(model: str, ps: Any) -> bool:
    """Whether Ollama's /api/ps document lists the model as loaded."""
    models = ps.get("models") if isinstance(ps, dict) else None
    loaded = {
        str(m.get(key, ""))
        for m in (models if isinstance(models, list) else [])
        if isinstance(m, dict)
        for key in ("name", "model")
    }
    # Ollama reports "name:latest" for a model pulled as "name".
    return model in loaded or (":" not in model and f"{model}:latest" in loaded)
