"""`localmodel gateway`: parse the flags, serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from localmodel.gateway.config import USAGE, ConfigError, GatewayConfig, parse_config
from localmodel.gateway.server import start_gateway


async def serve(config: GatewayConfig) -> None:
    running = await start_gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"localmodel gateway: listening on {config.listen_host}:{running.port}, "
        f"engine {config.engine} at {config.upstream}, {config.slots} slot(s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await running.stop()


def run_cli(argv: Sequence[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        return 0
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as exc:
        print(f"localmodel gateway: {exc}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        print(
            f"localmodel gateway: cannot listen on --listen "
            f"{config.listen_host}:{config.listen_port}: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0
