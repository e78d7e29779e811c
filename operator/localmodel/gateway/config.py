"""Gateway settings: flags, each also readable from LOCALMODEL_GATEWAY_<FLAG>.

Pure: `parse_config` takes the argument list and an environment mapping and
returns a frozen `GatewayConfig`, or raises `ConfigError` naming the flag.
Flags win over the environment; the environment wins over the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

Engine = Literal["ollama", "llama-server"]
EventLoop = Literal["auto", "asyncio", "uvloop"]
ENV_PREFIX = "LOCALMODEL_GATEWAY_"
# The overflow endpoint's API key is read from this variable only: a flag would
# put it in the process's command line, which any user of the node can read.
OVERFLOW_API_KEY_ENV = ENV_PREFIX + "OVERFLOW_API_KEY"


class ConfigError(ValueError):
    """A flag (or its environment variable) has a value the gateway cannot use."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"--{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str = "http://127.0.0.1:11434"
    engine: Engine = "ollama"
    listen_host: str = "0.0.0.0"
    listen_port: int = 8080
    model: str = ""
    slots: int = 1
    threads: int | None = None
    context: int | None = None
    max_queue: int = 16
    deadline: float = 600.0
    max_tokens: int = 2048
    keep_alive: str = "-1"
    max_body_bytes: int = 8 * 1024 * 1024
    # Connections that send no complete request for this long are closed:
    # aiohttp's keep-alive timer also runs from connection start, so it is both
    # the header timeout and the idle timeout.
    idle_timeout: float = 30.0
    # A request body must arrive within this many seconds.
    body_timeout: float = 30.0
    # asyncio's own loop by default. uvloop costs less CPU per relayed token
    # but added more p99 latency when requests arrive together (it defers
    # writes to the end of a loop pass): opt in with uvloop (required) or
    # auto (uvloop when installed). See docs/gateway.md, Overhead benchmark.
    event_loop: EventLoop = "asyncio"
    # An OpenAI-compatible endpoint for foreground requests that find no local
    # slot within overflow_after seconds (0: as soon as none is free). Empty:
    # no overflow. The base URL is the one OpenAI clients take (.../v1).
    overflow_url: str = ""
    overflow_model: str = ""
    overflow_after: float = 0.0
    # Never printed: not in repr, not in any message (see OVERFLOW_API_KEY_ENV).
    overflow_api_key: str = field(default="", repr=False)

    @property
    def overflow(self) -> bool:
        return bool(self.overflow_url)


def _int_at_least(minimum: int) -> Callable[[str, str], int]:
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(flag: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(flag, f"expected {wanted}, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(flag, f"expected {wanted}, got {raw!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_float(flag: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}")
    return value


def _non_negative_float(flag: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(flag, f"expected a number of seconds >= 0, got {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(flag, f"expected a number of seconds >= 0, got {raw!r}")
    return value


def _upstream(flag: str, raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            flag, f"expected an http(s) URL such as http://127.0.0.1:11434, got {raw!r}"
        )
    return raw.rstrip("/")


def _engine(flag: str, raw: str) -> str:
    if raw not in ("ollama", "llama-server"):
        raise ConfigError(flag, f"expected ollama or llama-server, got {raw!r}")
    return raw


def _listen(flag: str, raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise ConfigError(flag, f"expected HOST:PORT, got {raw!r}")
    try:
        port_number = int(port)
    except ValueError:
        raise ConfigError(flag, f"expected HOST:PORT with a numeric port, got {raw!r}") from None
    if not 0 <= port_number <= 65535:
        raise ConfigError(flag, f"port out of range in {raw!r}")
    return host.strip("[]"), port_number


def _keep_alive(flag: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(flag, "expected a duration such as -1, 5m or 300, got an empty value")
    return raw.strip()


def _event_loop(flag: str, raw: str) -> str:
    if raw not in ("auto", "asyncio", "uvloop"):
        raise ConfigError(flag, f"expected auto, asyncio or uvloop, got {raw!r}")
    return raw


def _text(flag: str, raw: str) -> str:
    return raw.strip()


# flag -> (parser, takes a value). Every flag takes a value.
_PARSERS: dict[str, Callable[[str, str], object]] = {
    "upstream": _upstream,
    "engine": _engine,
    "listen": _listen,
    "model": _text,
    "slots": _positive_int,
    "threads": _positive_int,
    "context": _positive_int,
    "max-queue": _non_negative_int,
    "deadline": _positive_float,
    "max-tokens": _positive_int,
    "keep-alive": _keep_alive,
    "max-body-bytes": _positive_int,
    "idle-timeout": _positive_float,
    "body-timeout": _positive_float,
    "event-loop": _event_loop,
    "overflow-url": _upstream,
    "overflow-model": _text,
    "overflow-after": _non_negative_float,
}

USAGE = """usage: localmodel gateway [--FLAG VALUE ...]

flags (each also read from LOCALMODEL_GATEWAY_<FLAG>, e.g. LOCALMODEL_GATEWAY_MAX_QUEUE):
  --upstream URL        engine base URL (default http://127.0.0.1:11434)
  --engine NAME         ollama | llama-server (default ollama)
  --listen HOST:PORT    where the gateway listens (default 0.0.0.0:8080)
  --model NAME          model served here; default for requests that omit it
  --slots N             concurrent generations (default 1)
  --threads N           options.num_thread forced on every Ollama request
  --context N           options.num_ctx default and ceiling
  --max-queue N         foreground requests that may wait (default 16)
  --deadline SECONDS    default and maximum request deadline (default 600)
  --max-tokens N        cap on num_predict / max_tokens (default 2048)
  --keep-alive VALUE    default keep_alive for Ollama requests (default -1)
  --max-body-bytes N    request body limit, 413 above it (default 8388608)
  --idle-timeout S      close connections idle or sending headers this long (default 30)
  --body-timeout S      a request body must arrive within this time (default 30)
  --event-loop NAME     asyncio | uvloop | auto (default asyncio; auto: uvloop if installed)
  --overflow-url URL    OpenAI-compatible base URL (e.g. https://api.example.com/v1) for
                        foreground requests that find no local slot in time; default none
  --overflow-model NAME the model name overflowed requests carry (required with --overflow-url)
  --overflow-after S    how long a foreground request waits for a local slot before it
                        overflows (default 0: as soon as none is free)

The overflow endpoint's API key is read from LOCALMODEL_GATEWAY_OVERFLOW_API_KEY only.
"""


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.upper().replace("-", "_")


def _collect(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    raw: dict[str, str] = {}
    for flag in _PARSERS:
        value = env.get(env_name(flag))
        if value is not None and value != "":
            raw[flag] = value
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(arg.lstrip("-") or arg, f"unexpected argument {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if name not in _PARSERS:
            raise ConfigError(name, "unknown flag")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(name, "missing value")
            value = args[i + 1]
            i += 1
        raw[name] = value
        i += 1
    return raw


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> GatewayConfig:
    """Build the settings from flags and environment; raise ConfigError on a bad value."""
    raw = _collect(argv, env)
    values = {flag: _PARSERS[flag](flag, value) for flag, value in raw.items()}
    kwargs: dict[str, object] = {}
    for flag, value in values.items():
        if flag == "listen":
            assert isinstance(value, tuple)
            kwargs["listen_host"], kwargs["listen_port"] = value
        else:
            kwargs[flag.replace("-", "_")] = value
    key = env.get(OVERFLOW_API_KEY_ENV, "").strip()
    if key:
        kwargs["overflow_api_key"] = key
    config = GatewayConfig(**kwargs)  # type: ignore[arg-type]
    if config.overflow and not config.overflow_model:
        raise ConfigError("overflow-model", "required with --overflow-url")
    if not config.overflow and (config.overflow_model or "overflow-after" in values):
        raise ConfigError("overflow-url", "required with --overflow-model and --overflow-after")
    return config
