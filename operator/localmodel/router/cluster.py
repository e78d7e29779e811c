"""The cluster's replicas, as the router routes over them. Pure.

Two watches feed it (router/follow.py runs them):

- **LocalModels**, in the namespaces the router serves: of each, its name,
  namespace, the name it is served as (`spec.model`: Ollama creates the model
  under it, llama-server serves it as `--alias`; api/spec.py), whether it
  runs the gateway (without one there is no gateway port to route to and no
  /speed to read: such a model is left out, and the log says so once) and
  whether its gateway asks for API keys (`spec.gateway.auth` set: listed only
  to callers its gateway accepts, router/keyed.py).
  Of a model that may sleep, also (`sleep_of`, each field read
  defensively: absent, of the wrong type or out of bounds reads as absent,
  never as an error, strings bounded) `spec.replicas` (0 is off),
  `spec.idle.holdSeconds`, and its status's `idle.state`,
  `idle.wake.message` and `idle.lastWake.seconds`: what tells an off
  model (503 at once) from a sleeping one (held, router/holding.py).
- **EndpointSlices** of the models' Services: which of a model's pods are
  Ready, and their IPs. The operator names a model's Service after the
  LocalModel and labels it as its own (`contract.OWNED_SELECTOR`); the
  EndpointSlice controller copies a Service's labels onto its slices, so the
  watch selects exactly the models' slices on the server.

Why EndpointSlices rather than pods: a slice is the readiness the Service
itself uses (a pod that is Ready and not terminating), in a small object that
changes only when a replica's readiness or address changes; a pod changes on
every status write (conditions, container states) and is many times larger.
Both are selectable by the operator's label; the slice is the cheaper stream.

A model's doorman (the pod `<name>-doorman` that answers for a released
sleeper, behind the same Service) is never a replica: requests wait at the
router for a replica instead.

Only what is read is kept (`ModelEntry`, `SliceEntry`), with bounds on how
many endpoints a slice keeps (`MAX_ENDPOINTS`); an object that cannot be read
is refused with the field and the reason (`Unreadable`), never raised past the
watch. Two LocalModels of one namespace serving the same name: the one whose
LocalModel name sorts first is routed, the others are reported (`Shadowed`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from localmodel.api.spec import MODEL_PATTERN
from localmodel.contract import DOORMAN_SUFFIX
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT
from localmodel.printable import printable
from localmodel.router.table import (
    ASLEEP,
    AWAKE,
    HOLD_SECONDS,
    WAKING,
    IdleRoute,
    ModelRoute,
    Replica,
    RouteTable,
)

Raw = Mapping[str, Any]

# The label the EndpointSlice controller sets on every slice it makes (its Service's name).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MAX_ENDPOINTS = 256  # Ready endpoints kept per slice (the API allows 1000 per slice)
MAX_NAME = 253  # a DNS subdomain: the longest object name Kubernetes has
_MODEL = re.compile(MODEL_PATTERN)
_MAX_MODEL = 200  # spec.model's maxLength (api/spec.py)
_UID = re.compile(r"[-0-9a-zA-Z]{0,64}")  # a Kubernetes uid (a UUID's text), or none
MAX_REPLICAS = 10_000  # a spec.replicas above it reads as absent (the default, 1)
MAX_HOLD_SECONDS = 3600.0  # spec.idle.holdSeconds' bound (api/spec.py)
MAX_WAKE_SECONDS = 86_400.0  # a status.idle.lastWake.seconds above a day reads as absent
MAX_WAKE_MESSAGE = 300  # characters of status.idle.wake.message kept


class Unreadable(ValueError):
    """An object the router cannot use; the message names the field and the reason."""


@dataclass(frozen=True)
class ModelEntry:
    """What the router reads of one LocalModel: its name, served name, and whether its gateway is
    on and keyed."""

    namespace: str
    name: str  # the LocalModel's (and its Service's) name
    served: str  # spec.model: what a request's `model` field says
    gateway: bool  # spec.gateway.enabled
    keyed: bool = False  # spec.gateway.auth is set: its gateway asks for API keys
    wanted: int = 1  # spec.replicas
    idle: IdleRoute | None = None  # spec.idle set (and what its status says of its sleep)


@dataclass(frozen=True)
class Endpoint:
    """One Ready endpoint of a slice: its pod, address and uid."""

    pod: str  # the pod's name: with its namespace (and uid), the replica's identity
    address: str  # its IP
    uid: str = ""  # the pod's uid (targetRef.uid), when the slice says it


@dataclass(frozen=True)
class SliceEntry:
    """What the router reads of one EndpointSlice: its namespace, Service and Ready endpoints."""

    namespace: str
    service: str
    endpoints: tuple[Endpoint, ...]  # Ready ones only, at most MAX_ENDPOINTS


@dataclass(frozen=True)
class Shadowed:
    """A LocalModel not routed: another in its namespace serves the same name."""

    namespace: str
    name: str
    served: str
    by: str  # the LocalModel that is routed instead

    @property
    def message(self) -> str:
        return (f"LocalModel {self.namespace}/{self.name} serves {self.served!r}, as does "
                f"{self.namespace}/{self.by}: requests for it go to {self.by}")


def _section(body: Raw, name: str, where: str) -> Raw:
    value = body.get(name, {})
    if not isinstance(value, Mapping):
        raise Unreadable(f"{where}{name}: not an object")
    return value


def _name(meta: Raw, field: str, where: str) -> str:
    value = meta.get(field)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise Unreadable(f"{where}metadata.{field}: missing, not a string or too long")
    return value


def object_key(body: Raw) -> tuple[str, str]:
    """(namespace, name) of any namespaced object, or Unreadable."""
    meta = _section(body, "metadata", "")
    return _name(meta, "namespace", ""), _name(meta, "name", "")


def keep_model(body: Raw) -> ModelEntry:
    """What the router reads of a LocalModel."""
    namespace, name = object_key(body)
    where = f"LocalModel {namespace}/{name}: "
    spec = _section(body, "spec", where)
    served = spec.get("model")
    if not isinstance(served, str) or len(served) > _MAX_MODEL or not _MODEL.match(served):
        raise Unreadable(f"{where}spec.model: missing or not a model name")
    gateway = _section(spec, "gateway", where + "spec.")
    enabled = gateway.get("enabled", True)
    if not isinstance(enabled, bool):
        raise Unreadable(f"{where}spec.gateway.enabled: not true or false")
    # Only whether keys are asked: the Secret's name is not the router's to know.
    auth = gateway.get("auth")
    if auth is not None and not isinstance(auth, Mapping):
        raise Unreadable(f"{where}spec.gateway.auth: not an object")
    wanted = _whole(spec.get("replicas"), MAX_REPLICAS)
    return ModelEntry(namespace, name, served, enabled, keyed=auth is not None,
                      wanted=1 if wanted is None else wanted, idle=sleep_of(body))


def _whole(value: Any, top: float) -> int | None:
    """A whole number from 0 to `top`, else None (absent)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        return None
    return value


def _seconds(value: Any, low: float, top: float) -> float | None:
    """A number of seconds from `low` to `top`, else None (absent; NaN fails both)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= top:
        return None
    return float(value)


def _mapping(parent: Any, name: str) -> Raw:
    value = parent.get(name) if isinstance(parent, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def sleep_of(body: Raw) -> IdleRoute | None:
    """What the router reads of a model's sleep: None without `spec.idle` (an
    object there); each other field read defensively (absent when absent, of
    the wrong type or out of bounds), so a status written by any operator
    version, or by a tenant, never makes the model unreadable."""
    spec = body.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("idle"), Mapping):
        return None
    hold = _seconds(spec["idle"].get("holdSeconds"), 1.0, MAX_HOLD_SECONDS)
    idle = _mapping(body.get("status"), "idle")
    state = idle.get("state")
    message = _mapping(idle, "wake").get("message")
    last = _seconds(_mapping(idle, "lastWake").get("seconds"), 0.0, MAX_WAKE_SECONDS)
    return IdleRoute(
        hold_seconds=HOLD_SECONDS if hold is None else hold,
        state=state if state in (AWAKE, ASLEEP, WAKING) else "",
        wake_message=printable(message, MAX_WAKE_MESSAGE) if isinstance(message, str) else "",
        last_wake_seconds=last)


def _address(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise Unreadable(f"{where}: not an IP address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise Unreadable(f"{where}: {value[:64]!r} is not an IP address") from None


def _ready_endpoint(item: Any, where: str) -> Endpoint | None:
    if not isinstance(item, Mapping):
        raise Unreadable(f"{where}: not an object")
    conditions = item.get("conditions") or {}
    if not isinstance(conditions, Mapping):
        raise Unreadable(f"{where}.conditions: not an object")
    # discovery.k8s.io/v1: an unset `ready` is unknown, which consumers take as ready;
    # a terminating endpoint is never ready.
    if conditions.get("ready", True) is not True or conditions.get("terminating") is True:
        return None
    addresses = item.get("addresses")
    if not isinstance(addresses, list) or not addresses:
        raise Unreadable(f"{where}.addresses: missing")
    address = _address(addresses[0], f"{where}.addresses[0]")
    ref = item.get("targetRef") or {}
    if not isinstance(ref, Mapping):
        raise Unreadable(f"{where}.targetRef: not an object")
    pod = ref.get("name") if ref.get("kind") == "Pod" else None
    if pod is not None and (not isinstance(pod, str) or not pod or len(pod) > MAX_NAME):
        raise Unreadable(f"{where}.targetRef.name: not a pod name")
    uid = ref.get("uid", "") if pod is not None else ""
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        raise Unreadable(f"{where}.targetRef.uid: not a uid")
    return Endpoint(pod or address, address, uid)


def keep_slice(body: Raw) -> SliceEntry:
    """What the router reads of an EndpointSlice: its Service and its Ready endpoints."""
    namespace, name = object_key(body)
    where = f"EndpointSlice {namespace}/{name}"
    labels = _section(_section(body, "metadata", ""), "labels", where + ": metadata.")
    service = labels.get(SERVICE_NAME_LABEL)
    if not isinstance(service, str) or not service or len(service) > MAX_NAME:
        raise Unreadable(f"{where}: metadata.labels[{SERVICE_NAME_LABEL}]: missing")
    if body.get("addressType") not in ("IPv4", "IPv6"):
        return SliceEntry(namespace, service, ())  # FQDN endpoints: no pod to route to
    items = body.get("endpoints") or []
    if not isinstance(items, list):
        raise Unreadable(f"{where}: endpoints: not a list")
    ready: list[Endpoint] = []
    for i, item in enumerate(items):
        endpoint = _ready_endpoint(item, f"{where}: endpoints[{i}]")
        if endpoint is not None and len(ready) < MAX_ENDPOINTS:
            ready.append(endpoint)
    return SliceEntry(namespace, service, tuple(ready))


def _url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def replica(namespace: str, endpoint: Endpoint) -> Replica:
    return Replica(namespace=namespace, name=endpoint.pod,
                   url=_url(endpoint.address, GATEWAY_PORT),
                   admin_url=_url(endpoint.address, ADMIN_PORT), uid=endpoint.uid)


def route_table(models: Iterable[ModelEntry],
                slices: Iterable[SliceEntry]) -> tuple[RouteTable, tuple[Shadowed, ...]]:
    """Each routed model with its Ready replicas (sorted by pod name, each once),
    and the LocalModels left out because another serves their name."""
    ready: dict[tuple[str, str], dict[str, Endpoint]] = {}
    for s in slices:
        pods = ready.setdefault((s.namespace, s.service), {})
        for e in s.endpoints:
            if e.pod != s.service + DOORMAN_SUFFIX:  # the doorman is never a replica
                pods.setdefault(e.pod, e)
    chosen: dict[tuple[str, str], ModelEntry] = {}
    shadowed: list[Shadowed] = []
    for m in sorted(models, key=lambda m: (m.namespace, m.name)):
        if not m.gateway:
            continue
        first = chosen.setdefault((m.namespace, m.served), m)
        if first is not m:
            shadowed.append(Shadowed(m.namespace, m.name, m.served, first.name))
    table = tuple(
        ModelRoute(namespace=m.namespace, name=m.served,
                   replicas=tuple(replica(m.namespace, e) for _, e in
                                  sorted(ready.get((m.namespace, m.name), {}).items())),
                   keyed=m.keyed, localmodel=m.name, wanted=m.wanted, idle=m.idle)
        for (_, _), m in sorted(chosen.items())
    )
    return table, tuple(shadowed)
