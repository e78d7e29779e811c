"""Gateway settings: flags, each also readable from LOCALMODEL_GATEWAY_<FLAG>.

Pure: `parse_config` takes the argument list and an environment mapping and
returns a frozen `GatewayConfig`, or raises `ConfigError` naming the flag.
Flags win over the environment; the environment wins over the defaults.
Each setting is written once, in `GatewayConfig`: default, help and parser
(`localmodel.settings.setting`); the flag table and `USAGE` are read from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from localmodel.engines import llama_server, ollama
from localmodel.gateway.ledger import DEFAULT_LEDGER_SIZE
from localmodel.settings import (
    ConfigError,
    field_values,
    flags,
    http_url,
    listen,
    non_negative_int,
    non_negative_seconds,
    one_of,
    parse_argv,
    positive_int,
    positive_seconds,
    setting,
    text,
    usage_lines,
)
from localmodel.settings import env_name as _env_name

__all__ = ["USAGE", "ConfigError", "GatewayConfig", "env_name", "parse_config"]

# The engines the gateway fronts, by their own names (localmodel.engines);
# --engine takes one of them.
ENGINES = (ollama.NAME, llama_server.NAME)
EventLoop = Literal["auto", "asyncio", "uvloop"]
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoop)
ENV_PREFIX = "LOCALMODEL_GATEWAY_"
# The overflow endpoint's API key is read from this variable only: a flag would
# put it in the process's command line, which any user of the node can read.
OVERFLOW_API_KEY_ENV = ENV_PREFIX + "OVERFLOW_API_KEY"


def _keep_alive(flag: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(flag, "expected a duration such as -1, 5m or 300, got an empty value")
    return raw.strip()


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str = setting(
        f"http://127.0.0.1:{ollama.PORT}", "engine base URL", metavar="URL", parse=http_url
    )
    engine: str = setting(
        ollama.NAME, " | ".join(ENGINES), metavar="NAME", parse=one_of(*ENGINES)
    )
    listen_host: str = setting(
        "0.0.0.0", "where the gateway listens", flag="listen", also=("listen_port",),
        metavar="HOST:PORT", parse=listen,
    )
    listen_port: int = 8080  # set by --listen, with listen_host
    model: str = setting(
        "", "model served here; default for requests that omit it", metavar="NAME", parse=text
    )
    slots: int = setting(1, "concurrent generations", metavar="N", parse=positive_int)
    threads: int | None = setting(
        None, "options.num_thread forced on every Ollama request", metavar="N", parse=positive_int
    )
    context: int | None = setting(
        None, "options.num_ctx default and ceiling", metavar="N", parse=positive_int
    )
    max_queue: int = setting(
        16, "foreground requests that may wait", metavar="N", parse=non_negative_int
    )
    deadline: float = setting(
        600.0, "default and maximum request deadline", metavar="SECONDS", parse=positive_seconds
    )
    max_tokens: int = setting(
        2048, "cap on num_predict / max_tokens", metavar="N", parse=positive_int
    )
    keep_alive: str = setting(
        "-1", "default keep_alive for Ollama requests", metavar="VALUE", parse=_keep_alive
    )
    calibrate_tokens: int = setting(
        32, "tokens decoded once at readiness to calibrate this replica's speed (0: none)",
        metavar="N", parse=non_negative_int,
    )
    max_body_bytes: int = setting(
        8 * 1024 * 1024, "request body limit, 413 above it", metavar="N", parse=positive_int
    )
    # aiohttp's keep-alive timer also runs from connection start, so it is both
    # the header timeout and the idle timeout.
    idle_timeout: float = setting(
        30.0, "close connections idle or sending headers this long", metavar="S",
        parse=positive_seconds,
    )
    body_timeout: float = setting(
        30.0, "a request body must arrive within this time", metavar="S", parse=positive_seconds
    )
    # uvloop costs less CPU per relayed token but added more p99 latency when
    # requests arrive together (it defers writes to the end of a loop pass):
    # opt in with uvloop (required) or auto. See docs/gateway.md, Overhead
    # benchmark.
    event_loop: EventLoop = setting(
        "asyncio", " | ".join(EVENT_LOOPS) + " (default {default}; auto: uvloop if installed)",
        metavar="NAME", parse=one_of(*EVENT_LOOPS),
    )
    # The base URL is the one OpenAI clients take (.../v1).
    overflow_url: str = setting(
        "", "OpenAI-compatible base URL (e.g. https://api.example.com/v1) for foreground "
        "requests that find no local slot in time", shown_default="none", metavar="URL",
        parse=http_url,
    )
    overflow_model: str = setting(
        "", "the model name overflowed requests carry (required with --overflow-url)",
        metavar="NAME", parse=text,
    )
    overflow_after: float = setting(
        0.0, "how long a foreground request waits for a local slot before it overflows "
        "(default {default}: as soon as none is free)", metavar="S", parse=non_negative_seconds,
    )
    # About 1 KB a record (docs/gateway.md, The ledger).
    ledger_size: int = setting(
        DEFAULT_LEDGER_SIZE, "requests the ledger keeps for GET /ledger and `localmodel "
        "timeline` (0: no ledger)", metavar="N", parse=non_negative_int,
    )
    # Never printed: not in repr, not in any message (see OVERFLOW_API_KEY_ENV).
    overflow_api_key: str = field(default="", repr=False)

    @property
    def overflow(self) -> bool:
        return bool(self.overflow_url)


FLAGS = flags(GatewayConfig)

USAGE = f"""usage: localmodel gateway [--FLAG VALUE ...]

flags (each also read from LOCALMODEL_GATEWAY_<FLAG>, e.g. LOCALMODEL_GATEWAY_MAX_QUEUE):
{usage_lines(FLAGS)}

The overflow endpoint's API key is read from {OVERFLOW_API_KEY_ENV} only.
"""


def env_name(flag: str) -> str:
    return _env_name(ENV_PREFIX, flag)


def _collect(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """Raw values by flag: the environment's (empty: not set), then the flags'."""
    raw = {name: env[env_name(name)] for name in FLAGS if env.get(env_name(name))}
    raw.update(parse_argv(FLAGS, argv))
    return raw


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> GatewayConfig:
    """Build the settings from flags and environment; raise ConfigError on a bad value."""
    raw = _collect(argv, env)
    kwargs = field_values(FLAGS, raw)
    key = env.get(OVERFLOW_API_KEY_ENV, "").strip()
    if key:
        kwargs["overflow_api_key"] = key
    config = GatewayConfig(**kwargs)
    if config.overflow and not config.overflow_model:
        raise ConfigError("overflow-model", "required with --overflow-url")
    if not config.overflow and (config.overflow_model or "overflow-after" in raw):
        raise ConfigError("overflow-url", "required with --overflow-model and --overflow-after")
    return config
