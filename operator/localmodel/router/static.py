"""`--replicas MODEL=URL[,URL...]`: a fixed table, for local use and tests. Pure.

Each value names one model and its replicas' gateways:

    --replicas gemma3:270m=http://10.0.0.7:8080|http://10.0.0.7:8090,http://10.0.0.8:8080

- MODEL is the served name (what a request's `model` field says), read as
  the router reads a request's `model` (router/table.py): when its text before
  the first slash is a namespace's name it is `namespace/name` and sets the
  namespace too (`team-a/chat`; `team-b/library/qwen3` serves `library/qwen3`
  in team-b), else it is the served name in the namespace `static`
  (`gemma3:270m`, `hf.co/user/repo:tag`). So two namespaces serving one name
  can be tried locally, and `--replicas team-b/team-a/chat=...` is team-b's
  model, reached only as `team-b/team-a/chat`.
- Each URL is a replica's gateway (its inference port), optionally followed by
  `|ADMIN_URL`, its admin port (where /speed is read). Without it the router
  still reads /slots on the main port but knows no prefill speed there, so it
  never spills a session onto or off that replica by cost.
- `;keys` after the URLs says the model's gateways ask for API keys: the
  router lists it only to callers whose key its gateway accepts
  (router/keyed.py); without it the model is listed to everyone.
- The flag repeats, once per model; one model given twice is an error.

A replica's name is its URL, and its identity `namespace/URL`: the same on
every router given the same flags, which is what rendezvous hashing needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from localmodel.api.spec import MODEL_PATTERN
from localmodel.router.table import ModelRoute, Replica, RouteTable, split_qualified

FLAG = "--replicas"
DEFAULT_NAMESPACE = "static"
_MODEL = re.compile(MODEL_PATTERN)
KEYS_MARK = "keys"  # `MODEL=URL,...;keys`: the model's gateways ask for API keys
MAX_REPLICAS = 256  # per model: the flag is an operator's, not a stranger's, but bounded


class BadReplicas(ValueError):
    """A --replicas value that cannot be used; the message names flag, value and reason."""

    def __init__(self, value: str, reason: str) -> None:
        super().__init__(f"{FLAG} {value!r}: {reason}")


def _url(value: str, raw: str, what: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadReplicas(value, f"{what} {raw!r} is not an http(s) URL with a host")
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        raise BadReplicas(value, f"{what} {raw!r} must be a base URL (no path, query or fragment)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise BadReplicas(value, f"{what} {raw!r} has a bad port") from None
    return raw.rstrip("/")


def parse_value(value: str) -> ModelRoute:
    """One --replicas value as a model's route."""
    model, eq, urls = value.partition("=")
    urls, semicolon, marks = urls.partition(";")
    if semicolon and marks.strip() != KEYS_MARK:
        raise BadReplicas(value, f"after ';' only {KEYS_MARK!r} may follow the URLs")
    model = model.strip()
    if not eq or not model:
        raise BadReplicas(value, "expected MODEL=URL[,URL...]")
    namespace, name = split_qualified(model) or (DEFAULT_NAMESPACE, model)
    if not _MODEL.match(name) or name.endswith("/"):
        raise BadReplicas(value, f"model {model!r}: {name!r} is not a model name (letters, "
                                 "digits, '.', '_', '-' and '/', then an optional ':tag')")
    items = [u.strip() for u in urls.split(",")]
    if not any(items) or not all(items):
        raise BadReplicas(value, "an empty replica URL")
    if len(items) > MAX_REPLICAS:
        raise BadReplicas(value, f"{len(items)} replicas, over the limit of {MAX_REPLICAS}")
    replicas = []
    for item in items:
        main, bar, admin = item.partition("|")
        url = _url(value, main.strip(), "URL")
        admin_url = _url(value, admin.strip(), "admin URL") if bar else None
        replicas.append(Replica(namespace=namespace, name=url, url=url, admin_url=admin_url))
    if len({r.name for r in replicas}) != len(replicas):
        raise BadReplicas(value, "a replica URL is given twice")
    return ModelRoute(namespace=namespace, name=name, replicas=tuple(replicas),
                      keyed=bool(semicolon))


def parse_replicas(values: Sequence[str]) -> RouteTable:
    """Every --replicas value, as a route table."""
    routes = [parse_value(v) for v in values]
    seen: set[tuple[str, str]] = set()
    for value, route in zip(values, routes, strict=True):
        key = (route.namespace, route.name)
        if key in seen:
            raise BadReplicas(value, f"model {route.qualified} is given more than once")
        seen.add(key)
    return tuple(routes)


@dataclass(frozen=True)
class StaticSource:
    """Keeps a fixed route table (`--replicas`: local use and tests)."""

    table: RouteTable

    def routes(self) -> RouteTable:
        return self.table


def static_source(values: Sequence[str]) -> StaticSource:
    return StaticSource(parse_replicas(values))
