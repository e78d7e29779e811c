"""`localmodel router`: parse the flags, pick the replicas' source (static
with --replicas, else the cluster's), serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.marks import public_key_text
from localmodel.router.config import RouterConfig, config_from, parser
from localmodel.router.server import start_router
from localmodel.router.signing import read_signing_key
from localmodel.router.source import SourceUnavailable, add_cluster_flags, cluster_source
from localmodel.router.static import BadReplicas, static_source
from localmodel.router.table import ReplicaSource, qualified_only_notes
from localmodel.settings import ConfigError, PortTaken


async def serve(config: RouterConfig, source: ReplicaSource, mode: str) -> None:
    running = await start_router(config, source)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    models = ", ".join(r.qualified for r in source.routes()) or "none yet"
    if mode == "static":  # the cluster source logs these as its table changes
        for note in qualified_only_notes(source.routes()):
            print(f"localmodel router: {note}", file=sys.stderr, flush=True)
    print(f"localmodel router: listening on {config.listen_host}:{running.port} "
          f"(admin: {config.admin_host}:{running.admin_port}), {mode} replicas; models: {models}",
          file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await running.stop()


def run_cli(argv: Sequence[str]) -> int:
    p = parser()
    add_cluster_flags(p)
    args = p.parse_args(list(argv))  # --help and unknown flags exit here, as argparse does
    try:
        config = config_from(args)
        if args.signing_key:
            config = replace(config, signing_key=read_signing_key(args.signing_key))
        source: ReplicaSource
        if args.replicas:
            source, mode = static_source(args.replicas), "static"
        else:
            source, mode = cluster_source(args), "cluster"
    except (ConfigError, BadReplicas, SourceUnavailable) as exc:
        print(f"localmodel router: {exc}", file=sys.stderr)
        return 2
    if config.signing_key is None:
        made = Ed25519PrivateKey.generate()
        config = replace(config, signing_key=made)
        print("localmodel router: no --signing-key: signing with a key made now; gateways "
              "accept its marks (owned sessions, /slots' session keys) only given "
              f"--router-key {public_key_text(made)}", file=sys.stderr, flush=True)
    try:
        asyncio.run(serve(config, source, mode))
    except PortTaken as exc:
        print(f"localmodel router: {exc}", file=sys.stderr)
        return 2
    return 0
