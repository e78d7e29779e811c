"""The router's `GET /waiting` (its admin port): which models have requests
held for them to wake, written by the router (`waiting_document`) and read
by the operator (`parse_waiting`), in one home. Pure.

The shape: `{"serial": n, "models": [{"model": "ns/name", "held": n,
"foreground": n, "oldest_s": s}]}`. `model` is the LocalModel to wake
(`namespace/<LocalModel name>`), `held` its requests the router holds,
`foreground` those of them not marked `X-Priority: background`, `oldest_s`
how long the oldest has waited. `serial` changes whenever what is held
changes; `?after=<serial>&wait=<s>` answers at once when the router's serial
is another, else when it changes or `wait` seconds (at most MAX_WAIT_S) pass
(a long poll: the operator learns of a hold one round-trip after it).

The reader treats the answer as hostile (a router pod could be anyone's on
the wire): at most MAX_BYTES read, strict UTF-8 JSON without NaN or
Infinity, at most MAX_MODELS entries, every count and time inside a named
bound, every name a namespace's and an object's; anything else is one
exception, `BadWaiting`, and nothing of that answer is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

WAITING_PATH = "/waiting"
ROUTER_ADMIN_PORT = 8090  # where the router serves it (its --admin-listen default; the chart's)
MAX_WAIT_S = 30.0  # the longest long poll
MAX_MODELS = 512  # entries in one answer (the router's --places bounds it far lower)
MAX_BYTES = 256 * 1024  # the longest answer written or read
MAX_HELD = 100_000  # a count above it is not a router's
MAX_OLDEST_S = 86_400.0  # a day: no request is held that long
MAX_SERIAL = 2**53  # a float still holds every whole number below it
_NAMESPACE = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_OBJECT = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_MODEL = re.compile(f"{_NAMESPACE}/{_OBJECT}")


class BadWaiting(ValueError):
    """A /waiting answer that is not the router's document."""


@dataclass(frozen=True)
class WaitingModel:
    """One model with requests held for it to wake: which, how many, how many
    foreground, and how long the oldest has waited."""

    model: str  # namespace/<LocalModel name>
    held: int
    foreground: int  # of `held`
    oldest_s: float

    @property
    def namespace(self) -> str:
        return self.model.partition("/")[0]

    @property
    def name(self) -> str:
        return self.model.partition("/")[2]


@dataclass(frozen=True)
class Waiting:
    """One /waiting answer: the router's serial and the models it holds requests for."""

    serial: int
    models: tuple[WaitingModel, ...]


def waiting_document(serial: int, models: Sequence[WaitingModel]) -> bytes:
    """The router's answer: the models that waited longest first, as many as
    fit MAX_MODELS and MAX_BYTES."""
    kept: list[dict[str, Any]] = []
    size = 64
    for m in sorted(models, key=lambda m: (-m.oldest_s, m.model))[:MAX_MODELS]:
        entry = {"model": m.model, "held": m.held, "foreground": m.foreground,
                 "oldest_s": round(m.oldest_s, 3)}
        size += len(json.dumps(entry)) + 2
        if size > MAX_BYTES:
            break
        kept.append(entry)
    return json.dumps({"serial": serial, "models": kept}, separators=(",", ":")).encode()


def _no_constant(name: str) -> NoReturn:
    raise BadWaiting(f"{name} is not a number")


def _whole(value: Any, where: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise BadWaiting(f"{where}: not a whole number from 0 to {top}")
    return value


def _entry(item: Any, i: int) -> WaitingModel:
    where = f"models[{i}]"
    if not isinstance(item, Mapping):
        raise BadWaiting(f"{where}: not an object")
    model = item.get("model")
    if not isinstance(model, str) or len(model) > 317 or not _MODEL.fullmatch(model):
        raise BadWaiting(f"{where}.model: not namespace/name")
    held = _whole(item.get("held"), f"{where}.held", MAX_HELD)
    foreground = _whole(item.get("foreground"), f"{where}.foreground", held)
    oldest = item.get("oldest_s")
    if isinstance(oldest, bool) or not isinstance(oldest, int | float) \
            or not 0 <= oldest <= MAX_OLDEST_S:
        raise BadWaiting(f"{where}.oldest_s: not seconds from 0 to {MAX_OLDEST_S:g}")
    return WaitingModel(model, held, foreground, float(oldest))


def parse_waiting(raw: bytes) -> Waiting:
    """A router's /waiting answer, checked whole; BadWaiting names what is wrong."""
    if len(raw) > MAX_BYTES:
        raise BadWaiting(f"longer than {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except BadWaiting:
        raise
    except Exception as exc:  # whatever the decoder trips on is the answer's fault
        raise BadWaiting(f"not JSON ({type(exc).__name__})") from exc
    if not isinstance(doc, Mapping):
        raise BadWaiting("not an object")
    serial = _whole(doc.get("serial"), "serial", MAX_SERIAL)
    items = doc.get("models")
    if not isinstance(items, list) or len(items) > MAX_MODELS:
        raise BadWaiting(f"models: not a list of at most {MAX_MODELS}")
    models = tuple(_entry(item, i) for i, item in enumerate(items))
    if len({m.model for m in models}) != len(models):
        raise BadWaiting("models: a model listed twice")
    return Waiting(serial, models)
