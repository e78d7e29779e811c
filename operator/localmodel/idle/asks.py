"""Where the idle decisions meet the operator's shell: what the shell gathered
for a pass (`IdleSignals`: the routers' held requests, the answers to the last
closes) and the closes the pass asks it to send (`CloseAsk`), with their
outcomes (`Closed`).

Pure values only. The shell long-polls each router's `GET /waiting`
(gateway_contract/waiting_answer.py) and sends each ask as a signed
`POST /yield` to the replica's gateway (gateway/door.py), which decides on its
own counts at that moment: an ask is never an eviction by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from localmodel.gateway_contract.waiting_answer import WaitingModel
from localmodel.speed import Reading

CloseReason = Literal["sleep", "yield", "reopen"]


@dataclass(frozen=True)
class CloseAsk:
    """Ask one replica's gateway to close (`sleep`: its model falls asleep and
    is released; `yield`: it gives its node to `for_`, a waking model's key) or
    to open again (`reopen`: a close of a multi-replica model that another
    replica refused). `idle_at_least` is the quiet time the gateway must have
    seen for a close to be accepted."""

    namespace: str
    model: str  # the LocalModel's name
    pod: str
    reason: CloseReason
    idle_at_least: int = 0
    for_: str = ""  # "namespace/name" of the waker, for a yield
    ip: str = ""  # the pod's address: the shell calls its gateway's admin port there
    node: str = ""  # the node a yield gives `for_` (reserved for it once closed)

    @property
    def key(self) -> str:
        """The model's key, "namespace/name"."""
        return f"{self.namespace}/{self.model}"


class CloseResult(StrEnum):
    """How a gateway answered an ask."""

    CLOSED = "closed"  # 200 {"closed": true}: nothing in flight, now refusing work
    OPENED = "opened"  # 200 {"closed": false}: a reopen done
    BUSY = "busy"  # 409: requests in flight or queued, or not quiet for long enough
    FORBIDDEN = "forbidden"  # 403: the mark was refused (key, pod, replay)
    UNREACHABLE = "unreachable"  # no answer in time, or the connection failed
    BAD = "bad"  # an answer this operator cannot read


@dataclass(frozen=True)
class Closed:
    """The answer to one `CloseAsk`, at `at` (seconds, the operator's wall
    clock), with the gateway's counts when it said busy."""

    ask: CloseAsk
    result: CloseResult
    at: float
    in_flight: int = 0
    queued: int = 0
    lease_seconds: float = 0.0


@dataclass(frozen=True)
class IdleSettings:
    """The operator's idle settings: whether a router runs (`--router-namespace`:
    without one nothing holds a request while a model wakes, so none sleeps);
    the quiet time a yield asks for (`grace_s`, also the anti-thrash time and
    how long a refused ask is not repeated); how long a node given by a yield
    stays reserved for its waker (`reserve_s`); and how old a replica's
    activity reading may be and still count (`stale_s`: older is unknown, and
    unknown is not idle)."""

    router: bool = True
    grace_s: float = 30.0
    reserve_s: float = 120.0
    stale_s: float = 180.0


@dataclass(frozen=True)
class IdleSignals:
    """What the shell knows for one pass: `waiting`, the routers' held requests
    per model key ("namespace/name"), summed over routers; `closes`, the latest
    answer per pod ("namespace/pod"); `readings`, each replica's last `/speed`
    reading by model key and replica (its `activity` is the idle signal, its
    `at` says how old it is); `now`, seconds on the wall clock; `settings`."""

    now: float
    waiting: Mapping[str, WaitingModel] = field(default_factory=lambda: MappingProxyType({}))
    closes: Mapping[str, Closed] = field(default_factory=lambda: MappingProxyType({}))
    readings: Mapping[str, Mapping[int, Reading]] = field(
        default_factory=lambda: MappingProxyType({}))
    settings: IdleSettings = IdleSettings()


NO_SIGNALS = IdleSignals(now=0.0)
