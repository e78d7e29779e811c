"""`localmodel gateway`: parse the flags, serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from localmodel.gateway.config import DOORMAN_FLAG, USAGE, ConfigError, parse_config
from localmodel.gateway.doorman import start_doorman
from localmodel.gateway.keys import BadKeys, KeysFile
from localmodel.gateway.server import start_gateway
from localmodel.gateway_contract import GatewayConfig
from localmodel.settings import PortTaken


async def serve(config: GatewayConfig, loop_name: str = "asyncio") -> None:
    running = await start_gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    overflow = ""
    if config.overflow:
        # The host only: a URL may carry credentials, and the key is never printed.
        host = urlsplit(config.overflow_url).hostname
        overflow = f", foreground overflow to {host} after {config.overflow_after:g}s"
    keys = "" if not config.keys_file else f", API keys from {config.keys_file}"
    print(
        f"localmodel gateway: listening on {config.listen_host}:{running.port} "
        f"(admin: {config.admin_address[0]}:{running.admin_port}{keys}), "
        f"engine {config.engine} at {config.upstream}, {config.slots} slot(s), "
        f"{loop_name} event loop{overflow}",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await running.stop()


async def serve_doorman(config: GatewayConfig, loop_name: str = "asyncio") -> None:
    """The doorman (gateway/doorman.py): no engine, every slot route told 503."""
    running = await start_doorman(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    keys = "" if not config.keys_file else f", API keys from {config.keys_file}"
    print(
        f"localmodel gateway: doorman for {config.model or 'its model'} listening on "
        f"{config.listen_host}:{running.port} (admin: {config.admin_address[0]}:"
        f"{running.admin_port}{keys}), Retry-After {running.doorman.retry_after} s, "
        f"{loop_name} event loop",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await running.stop()


def loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The event loop to serve on: uvloop's when asked or, with `auto`, when it
    is installed (it relays a token with less CPU: its transports and loop
    are C); else asyncio's own. Returns (factory or None for asyncio's, name)."""
    if choice == "asyncio":
        return None, "asyncio"
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise
        return None, "asyncio"
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory, "uvloop"


def run_cli(argv: Sequence[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        return 0
    doorman = DOORMAN_FLAG in argv  # a mode, not a setting: it takes no value
    argv = [arg for arg in argv if arg != DOORMAN_FLAG]
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as exc:
        print(f"localmodel gateway: {exc}\n\n{USAGE}", file=sys.stderr)
        return 2
    if config.keys_file:
        try:
            KeysFile(config.keys_file, print)
        except (OSError, BadKeys) as exc:
            print(f"localmodel gateway: --keys-file {config.keys_file}: {exc}", file=sys.stderr)
            return 2
    try:
        factory, loop_name = loop_factory(config.event_loop)
    except ImportError:
        print("localmodel gateway: --event-loop uvloop: uvloop is not installed", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run((serve_doorman if doorman else serve)(config, loop_name))
    except PortTaken as exc:
        print(f"localmodel gateway: {exc}", file=sys.stderr)
        return 2
    return 0
