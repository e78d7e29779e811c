"""The router's settings (`localmodel router --help`), and their parsing.

The bounds on what clients send are the gateway's own defaults
(localmodel.gateway_contract.GatewayConfig), so a request the router lets
through is one the gateway behind it would read too, and the router refuses
early what the gateway would refuse anyway.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.waiting_answer import ROUTER_ADMIN_PORT
from localmodel.settings import ConfigError, listen, positive_seconds

_GW = GatewayConfig()
ROUTER_PORT = 8080
ADMIN_PORT = ROUTER_ADMIN_PORT
# Requests in progress at once (router/admission.py). Each holds at most one
# body of --max-body-bytes while it lasts: with the parse and the reads, 64 of
# them at the 1 MiB default fit the chart's 256 MiB (router_memory_bytes).
PLACES = 64
# Requests held per sleeping model at most (router/holding.py); never more
# than a quarter of the places, so held requests leave room for the rest.
HOLD_PER_MODEL = 16


def hold_bound(places: int, asked: int | None = None) -> int:
    """--hold-per-model: as asked, else HOLD_PER_MODEL; at most a quarter of
    --places (at least 1)."""
    return min(HOLD_PER_MODEL if asked is None else asked, max(1, places // 4))


@dataclass(frozen=True)
class RouterConfig:
    """The router's settings: where it listens, how often it reads the replicas, and its bounds."""

    listen_host: str = "0.0.0.0"
    listen_port: int = ROUTER_PORT
    admin_host: str = "0.0.0.0"
    admin_port: int = ADMIN_PORT
    poll_interval: float = 1.0  # seconds between reads of every replica's /slots and /speed
    deadline: float = _GW.deadline  # longest exchange with a replica
    connect_timeout: float = 5.0  # to open a connection to a replica
    max_body_bytes: int = _GW.max_body_bytes
    idle_timeout: float = _GW.idle_timeout  # header and idle timeout of a client's connection
    body_timeout: float = _GW.body_timeout
    places: int = PLACES  # requests in progress at once; 503 past them, the body unread
    body_reads: int = _GW.body_reads  # request bodies read and parsed at once
    hold_per_model: int = HOLD_PER_MODEL  # requests held per sleeping model (0: none)
    # The gateway's bounds for a parsed body (max_messages, max_string_bytes; read by
    # localmodel.gateway_contract.bounds).
    bounds: GatewayConfig = field(default=_GW, repr=False)
    # What the router signs its marks with (gateway_contract/marks.py; --signing-key, read
    # by cli.py); None: a key of its own, made at start, that no gateway knows.
    signing_key: Ed25519PrivateKey | None = field(default=None, repr=False)


# The router's memory limit (the chart's router.resources), sized from
# benchmarks/router_hostile.py (docs/benchmarks.md, Hostile bodies at the
# router) the way render/names.py sizes the gateway's. Measured at the 1 MiB
# default body limit with 64 places: about 40 MiB at rest; the parse of one
# worst body about 26 times the limit (parses run one at a time, on the event
# loop); each read in progress up to twice it; each place holding a valid
# body about once it (its bytes; the request sent to the replica is made for
# the send, not kept): every place held for 10 s by a 1 MiB body of empty
# objects peaked at 137 MiB. Hence 48 MiB + 30 x the limit + 2 x the limit a
# read + 1.25 x the limit a place, and half again for what a run does not
# hold (fragmentation, the sessions remembered), at least 256 MiB: the
# defaults need 249 MiB.
ROUTER_MEMORY_BYTES = 256 * 1024**2
_AT_REST = 48 * 1024**2
_PARSE_TIMES_BODY = 30
_READ_TIMES_BODY = 2
_PLACE_TIMES_BODY = 1.25


def router_memory_bytes(places: int = PLACES, body_reads: int = _GW.body_reads,
                        max_body_bytes: int = _GW.max_body_bytes) -> int:
    """The router's memory limit for its places, body reads and body limit, whole MiB."""
    body = max_body_bytes
    need = (_AT_REST + _PARSE_TIMES_BODY * body + _READ_TIMES_BODY * body * body_reads
            + _PLACE_TIMES_BODY * body * places)
    mib = -(-int(need * 1.5) // 1024**2)
    return max(ROUTER_MEMORY_BYTES, mib * 1024**2)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localmodel router",
        description="One endpoint for every model: the `model` field picks the LocalModel; "
                    "sessions stay on the replica holding their prompt (docs/router.md).")
    p.add_argument("--listen", default=f"0.0.0.0:{ROUTER_PORT}", metavar="HOST:PORT",
                   help="where the router listens (default %(default)s)")
    p.add_argument("--admin-listen", default=None, metavar="HOST:PORT",
                   help=f"where /metrics is served (default: the --listen host, port "
                        f"{ADMIN_PORT}; any free port with --listen port 0)")
    p.add_argument("--replicas", action="append", default=[], metavar="MODEL=URL[,URL...]",
                   help="a model and its replicas' gateways, URL|ADMIN_URL to give the admin "
                        "port too, ;keys at the end when they ask for API keys (listed only "
                        "to keys they accept); repeatable (static mode: the cluster is not read)")
    p.add_argument("--poll-interval", default="1", metavar="S",
                   help="seconds between reads of the replicas' /slots and /speed "
                        "(default %(default)s)")
    p.add_argument("--deadline", default=f"{_GW.deadline:g}", metavar="S",
                   help="longest exchange with a replica (default %(default)s)")
    p.add_argument("--signing-key", default="", metavar="FILE",
                   help="the Ed25519 private key (PEM) the router signs its marks to the "
                        "gateways with (the chart mounts the operator's Secret); default: "
                        "a new key each start, whose marks no gateway accepts unless given "
                        "its public key (printed at start)")
    p.add_argument("--max-body-bytes", type=int, default=_GW.max_body_bytes, metavar="N",
                   help="request body limit, 413 above it (default %(default)s)")
    p.add_argument("--places", type=int, default=PLACES, metavar="N",
                   help="requests in progress at once; past them 503 with Retry-After, "
                        "the body unread (default %(default)s)")
    p.add_argument("--body-reads", type=int, default=_GW.body_reads, metavar="N",
                   help="request bodies read and parsed at once, others wait their turn "
                        "(default %(default)s)")
    p.add_argument("--hold-per-model", type=int, default=None, metavar="N",
                   help="requests held per sleeping model while it wakes, each keeping its "
                        f"place; past them 503 with Retry-After (default {HOLD_PER_MODEL}; "
                        "at most a quarter of --places; 0: none held)")
    return p


def config_from(args: argparse.Namespace) -> RouterConfig:
    """RouterConfig from parsed flags; ConfigError names the flag."""
    host, port = listen("listen", args.listen)
    if args.admin_listen is not None:
        admin_host, admin_port = listen("admin-listen", args.admin_listen)
    else:
        admin_host, admin_port = host, (ADMIN_PORT if port else 0)
    if args.max_body_bytes < 1:
        raise ConfigError("max-body-bytes", f"{args.max_body_bytes} is not a positive number")
    for flag, value in (("places", args.places), ("body-reads", args.body_reads)):
        if value < 1:
            raise ConfigError(flag, f"{value} is not a positive number")
    hold = getattr(args, "hold_per_model", None)
    if hold is not None and hold < 0:
        raise ConfigError("hold-per-model", f"{hold} is not 0 or a positive number")
    return RouterConfig(
        listen_host=host, listen_port=port, admin_host=admin_host, admin_port=admin_port,
        poll_interval=positive_seconds("poll-interval", args.poll_interval),
        deadline=positive_seconds("deadline", args.deadline),
        max_body_bytes=args.max_body_bytes, places=args.places, body_reads=args.body_reads,
        hold_per_model=hold_bound(args.places, hold),
    )
