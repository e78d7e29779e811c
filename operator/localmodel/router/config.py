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
from localmodel.settings import ConfigError, listen, positive_seconds

_GW = GatewayConfig()
ROUTER_PORT = 8080
ADMIN_PORT = 8090


@dataclass(frozen=True)
class RouterConfig:
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
    # The gateway's bounds for a parsed body (max_messages, max_string_bytes; read by
    # localmodel.gateway_contract.bounds).
    bounds: GatewayConfig = field(default=_GW, repr=False)
    # What the router signs its marks with (gateway_contract/marks.py; --signing-key, read
    # by cli.py); None: a key of its own, made at start, that no gateway knows.
    signing_key: Ed25519PrivateKey | None = field(default=None, repr=False)


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
                        "port too; repeatable (static mode: the cluster is not read)")
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
    return RouterConfig(
        listen_host=host, listen_port=port, admin_host=admin_host, admin_port=admin_port,
        poll_interval=positive_seconds("poll-interval", args.poll_interval),
        deadline=positive_seconds("deadline", args.deadline),
        max_body_bytes=args.max_body_bytes,
    )
