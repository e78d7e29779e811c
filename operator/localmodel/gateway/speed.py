"""This replica's speed where it is served: a calibration at readiness and the
engine's timings of real traffic. Pure.

**Calibration.** Once the engine has loaded the model and before `/readyz`
answers 200 (so before the pod reports Ready), the gateway asks the engine for
one fixed generation with the pod's own settings: the prompt
`CALIBRATION_PROMPT`, greedy (temperature 0, seed 0), `CALIBRATION_TOKENS`
(32) tokens, streamed. Ollama: `/api/generate` with `raw: true` and the owned
runner options (`num_thread`, `num_ctx`: other values would reload the model);
llama-server: `/v1/completions` with `ignore_eos` (so it always decodes 32) and
`cache_prompt: false` (each engine's CALIBRATION_PATH and CALIBRATION_BODY,
localmodel.engines). Its rates are the engine's own timings (Ollama's
`eval_count / eval_duration`, llama-server's `timings`). A calibration that
takes longer than `CALIBRATION_DEADLINE_SECONDS` is stopped; its decode rate
is then the tokens seen over the time from the first to the last, on the
gateway's clock, marked incomplete. A failed calibration does not hold the pod
back: it becomes Ready without one.

**Recent.** Every request the engine served (background and foreground alike;
not the overflow's) adds its engine timing to a window of
`RECENT_WINDOW_SECONDS`; the recent rate is tokens over seconds of the window.
The totals since start let the operator compute the rate between two of its
reads exactly (localmodel/speed.py, `traffic`).

`GET /speed` answers `speed_document`: small (about 500 bytes), from memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from localmodel.engines import EngineFacts
from localmodel.gateway.routes import ROUTES, Kind
from localmodel.gateway_contract.timing import EngineTiming

CALIBRATION_TOKENS = 32
CALIBRATION_DEADLINE_SECONDS = 60.0
# A continuation every model keeps writing (Ollama has no ignore_eos).
CALIBRATION_PROMPT = (
    "Count from one to one hundred in words, separated by commas: one, two, three, four, five,"
)
RECENT_WINDOW_SECONDS = 300.0
RECENT_MAX_REQUESTS = 4096  # the window's memory bound, whatever the request rate


@dataclass(frozen=True)
class CalibrationCall:
    """The one request a calibration sends to the engine: its path, body and kind."""

    path: str
    body: dict[str, Any]
    kind: Kind


def calibration_call(engine: EngineFacts, model: str, options: dict[str, int],
                     keep_alive: Any, tokens: int = CALIBRATION_TOKENS) -> CalibrationCall:
    """The engine request of the calibration (see the module's doc): the
    engine's calibration route, its body in that route's shape with the
    engine's own fields."""
    path = engine.CALIBRATION_PATH
    kind = next((r.kind for r in ROUTES if r.path == path), None)
    extra = engine.CALIBRATION_BODY
    if kind is Kind.OPENAI_COMPLETION:
        return CalibrationCall(path, {
            "model": model or "model", "prompt": CALIBRATION_PROMPT, "max_tokens": tokens,
            "temperature": 0, "seed": 0, **extra,
            "stream": True, "stream_options": {"include_usage": True},
        }, kind)
    if kind is not Kind.GENERATE:
        raise ValueError(f"no calibration for engine {engine.NAME!r} at {path}")
    return CalibrationCall(path, {
        "model": model, "prompt": CALIBRATION_PROMPT, **extra, "stream": True,
        "keep_alive": keep_alive,
        "options": {**options, "num_predict": tokens, "temperature": 0, "seed": 0},
    }, kind)


@dataclass(frozen=True)
class Calibration:
    """One calibration's result: decode and prefill speeds, tokens, seconds, and whether it
    finished."""

    decode: float | None  # tokens per second
    prefill: float | None
    generated_tokens: int
    prompt_tokens: int | None
    seconds: float  # the whole calibration, on the gateway's clock
    complete: bool  # False: stopped at the deadline (decode is tokens seen / time)
    at: float  # epoch seconds
    error: str = ""


def calibration_from(timing: EngineTiming | None, tokens_seen: int, first: float | None,
                     last: float | None, seconds: float, at: float, complete: bool,
                     error: str = "") -> Calibration:
    """The engine's own timing when the generation finished; else the tokens
    seen after the first over the time to the last."""
    if timing is not None and timing.decode_tokens_per_second is not None:
        return Calibration(timing.decode_tokens_per_second, timing.prefill_tokens_per_second,
                           timing.generated_tokens or tokens_seen, timing.prompt_tokens,
                           seconds, complete, at, error)
    decode = None
    if first is not None and last is not None and last > first and tokens_seen > 1:
        decode = (tokens_seen - 1) / (last - first)
    return Calibration(decode, None, tokens_seen, None, seconds, False, at, error)


@dataclass(frozen=True)
class _Sample:
    """One finished request's tokens and engine seconds, for the recent speed."""

    at: float
    generated: int
    decode_s: float
    prompt: int
    prefill_s: float


@dataclass
class SpeedRecord:
    """The calibration, the recent window and the totals since start."""

    calibration: Calibration | None = None
    calibrating: bool = False
    requests: int = 0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._window: deque[_Sample] = deque(maxlen=RECENT_MAX_REQUESTS)

    def add(self, at: float, timing: EngineTiming) -> None:
        """One served request's engine timing (a request without one adds nothing)."""
        generated = max(0, timing.generated_tokens or 0)
        decode_s = max(0.0, timing.decode_seconds or 0.0)
        prompt = max(0, timing.prompt_tokens or 0)
        prefill_s = max(0.0, timing.prompt_seconds or 0.0)
        if not (decode_s or prefill_s):
            return
        self.requests += 1
        self.generated_tokens += generated
        self.decode_seconds += decode_s
        self.prompt_tokens += prompt
        self.prefill_seconds += prefill_s
        self._window.append(_Sample(at, generated, decode_s, prompt, prefill_s))

    def recent(self, now: float) -> tuple[int, float | None, float | None]:
        """(requests, decode tok/s, prefill tok/s) of the last RECENT_WINDOW_SECONDS."""
        while self._window and self._window[0].at < now - RECENT_WINDOW_SECONDS:
            self._window.popleft()
        samples = list(self._window)
        return (len(samples),
                _rate(sum(s.generated for s in samples), sum(s.decode_s for s in samples)),
                _rate(sum(s.prompt for s in samples), sum(s.prefill_s for s in samples)))


def _rate(tokens: float, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def speed_document(record: SpeedRecord, now: float, engine: str, model: str,
                   threads: int | None) -> dict[str, Any]:
    """The body of GET /speed."""
    c = record.calibration
    requests, decode, prefill = record.recent(now)
    return {
        "engine": engine,
        "model": model,
        "threads": threads,
        "calibrating": record.calibrating,
        "calibration": None if c is None else {
            "decode_tokens_per_second": _round(c.decode),
            "prefill_tokens_per_second": _round(c.prefill),
            "generated_tokens": c.generated_tokens,
            "prompt_tokens": c.prompt_tokens,
            "seconds": round(c.seconds, 3),
            "complete": c.complete,
            "at": round(c.at, 3),
            "error": c.error or None,
        },
        "recent": {
            "window_seconds": RECENT_WINDOW_SECONDS,
            "requests": requests,
            "decode_tokens_per_second": _round(decode),
            "prefill_tokens_per_second": _round(prefill),
        },
        "totals": {
            "requests": record.requests,
            "generated_tokens": record.generated_tokens,
            "decode_seconds": round(record.decode_seconds, 6),
            "prompt_tokens": record.prompt_tokens,
            "prefill_seconds": round(record.prefill_seconds, 6),
        },
    }
