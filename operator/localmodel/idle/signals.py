"""What the operator's idle shell decides without I/O: which router pods to
long-poll (`router_pods`, from the router Service's EndpointSlices), the
routers' held requests merged into one map (`merge_waiting`), how long to
wait before asking a failing router again (`retry_in`), how a gateway's
answer to a close reads (`closed_from_answer`), and which closes to renew
while their release is under way (`renewals`). Pure.

Everything read here is hostile: a slice is the API server's, but a router
pod's answer or a gateway's is whatever that pod sends. Each reader takes
what it can check and leaves the rest; nothing raises past it.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from localmodel.contract import ROUTER_POD_LABELS
from localmodel.gateway_contract.waiting_answer import (
    MAX_HELD,
    ROUTER_ADMIN_PORT,
    Waiting,
    WaitingModel,
)
from localmodel.idle.asks import CloseAsk, Closed, CloseResult

# The router Service's EndpointSlices carry its labels (the EndpointSlice
# controller copies a Service's labels): the chart labels it thus.
ROUTER_SLICE_SELECTOR = ",".join(f"{k}={v}" for k, v in ROUTER_POD_LABELS.items())
MAX_ROUTERS = 64  # router pods polled at once; more is not a router Deployment
BACKOFF_FIRST_S = 1.0  # a router that failed once is asked again this much later
BACKOFF_MAX_S = 60.0  # and never less often than this
CLOSE_ANSWER_MAX_BYTES = 4096  # a gateway's answer to POST /yield is read this far
MAX_COUNT = 1_000_000  # an in_flight or queued count above it is not a gateway's
# A close is renewed once a third of its lease has passed (two renewals can
# fail before it lapses), and for at most MAX_HOLD_S after the first: a release
# that takes longer lets it lapse, so the gateway opens again by itself.
RENEW_FRACTION = 1 / 3
MAX_HOLD_S = 600.0


@dataclass(frozen=True)
class RouterPod:
    """One router pod to long-poll: its name (or address), address and admin port."""

    name: str
    ip: str
    port: int = ROUTER_ADMIN_PORT

    @property
    def admin_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


def address(raw: Any) -> str | None:
    """`raw` as an IP address's text, None unless it is one (nothing else
    goes into a URL the operator calls)."""
    if not isinstance(raw, str) or len(raw) > 45:
        return None
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def _endpoints(slice_: Any) -> Iterable[RouterPod]:
    if not isinstance(slice_, Mapping) or slice_.get("addressType") not in ("IPv4", "IPv6"):
        return
    endpoints = slice_.get("endpoints")
    for ep in endpoints if isinstance(endpoints, list) else ():
        if not isinstance(ep, Mapping):
            continue
        conditions = ep.get("conditions")
        # Kubernetes: an unknown `ready` is to be read as ready.
        if isinstance(conditions, Mapping) and conditions.get("ready") is False:
            continue
        addresses = ep.get("addresses")
        ip = address(addresses[0]) if isinstance(addresses, list) and addresses else None
        if ip is None:
            continue
        ref = ep.get("targetRef")
        name = ref.get("name") if isinstance(ref, Mapping) else None
        yield RouterPod(name if isinstance(name, str) and 0 < len(name) <= 253 else ip, ip)


def router_pods(slices: Iterable[Any]) -> tuple[RouterPod, ...]:
    """The Ready router pods the slices list, one per address, in a stable
    order, at most MAX_ROUTERS."""
    found: dict[str, RouterPod] = {}
    for slice_ in slices:
        for pod in _endpoints(slice_):
            found.setdefault(pod.ip, pod)
    return tuple(sorted(found.values(), key=lambda p: (p.name, p.ip)))[:MAX_ROUTERS]


def merge_waiting(answers: Mapping[str, Waiting]) -> Mapping[str, WaitingModel]:
    """Each model's held requests summed over every router's last answer
    (`answers`: router -> its answer), the oldest the longest any router
    holds one; by model key, sorted."""
    held: dict[str, list[int]] = {}
    oldest: dict[str, float] = {}
    for answer in answers.values():
        for m in answer.models:
            counts = held.setdefault(m.model, [0, 0])
            counts[0] += m.held
            counts[1] += m.foreground
            oldest[m.model] = max(oldest.get(m.model, 0.0), m.oldest_s)
    return MappingProxyType({
        key: WaitingModel(key, min(h, MAX_HELD), min(f, h, MAX_HELD), oldest[key])
        for key, (h, f) in sorted(held.items())})


def retry_in(failures: int) -> float:
    """Seconds before asking a router again after `failures` failures in a
    row: doubling from BACKOFF_FIRST_S, at most BACKOFF_MAX_S."""
    if failures <= 0:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(failures - 1, 32))


def yield_body(ask: CloseAsk) -> bytes:
    """The body of the `POST /yield` that carries `ask`."""
    return json.dumps({"reason": ask.reason, "idle_at_least": ask.idle_at_least}).encode()


def _count(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(value, MAX_COUNT))


def _document(body: bytes) -> Mapping[str, Any] | None:
    if len(body) > CLOSE_ANSWER_MAX_BYTES:
        return None
    try:
        doc = json.loads(body.decode("utf-8"), parse_constant=lambda _: None)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, Mapping) else None


def closed_from_answer(ask: CloseAsk, status: int, body: bytes, at: float) -> Closed:
    """How a gateway answered `ask` (gateway/door.py): 200 `{"closed": true,
    "lease_seconds": s}` closed (a close asked), 200 `{"closed": false}`
    opened (a reopen asked), 409 busy with its counts, 403 forbidden; any
    other status or body is BAD."""
    if status == 403:
        return Closed(ask, CloseResult.FORBIDDEN, at)
    doc = _document(body)
    if status == 409:
        counts = doc or {}
        return Closed(ask, CloseResult.BUSY, at, _count(counts, "in_flight"),
                      _count(counts, "queued"))
    if status != 200 or doc is None or not isinstance(doc.get("closed"), bool):
        return Closed(ask, CloseResult.BAD, at)
    if ask.reason == "reopen":
        return Closed(ask, CloseResult.OPENED if doc["closed"] is False else CloseResult.BAD, at)
    lease = doc.get("lease_seconds")
    if doc["closed"] is not True or isinstance(lease, bool) or not isinstance(
            lease, int | float) or not (math.isfinite(lease) and 0 < lease <= 86400):
        return Closed(ask, CloseResult.BAD, at)
    return Closed(ask, CloseResult.CLOSED, at, lease_seconds=float(lease))


def pod_key(ask: CloseAsk) -> str:
    """The key of `IdleSignals.closes`: "namespace/pod"."""
    return f"{ask.namespace}/{ask.pod}"


def renewals(closes: Mapping[str, Closed], first_closed: Mapping[str, float], now: float,
             keep: frozenset[str] | None = None) -> list[CloseAsk]:
    """The closes to send again now so their leases do not lapse: answered
    CLOSED at least RENEW_FRACTION of their lease ago, first closed less than
    MAX_HOLD_S ago, and (when the pass said which it still needs, `keep`)
    still needed."""
    due = []
    for pod, c in sorted(closes.items()):
        if c.result is not CloseResult.CLOSED or (keep is not None and pod not in keep):
            continue
        if now - first_closed.get(pod, c.at) >= MAX_HOLD_S:
            continue
        if now - c.at >= c.lease_seconds * RENEW_FRACTION:
            due.append(c.ask)
    return due
