"""The gateway's wire contract, in one home: what the renderer, the controller,
doctor and timeline need to know of the slot gate (`localmodel gateway`,
localmodel.gateway) without importing it. Pure data and the few functions that
read or write it.

- where it listens (`GATEWAY_PORT`: the engine's routes, readiness, health,
  slots; `ADMIN_PORT`: metrics, speed, ledger) and the paths it answers;
- the prefix of every metric it exports (`METRIC_PREFIX`: doctor reads them);
- the ledger's record (`LedgerEntry`, as GET /ledger serves it) and its
  reading back (`parse_entries`, `merge`: timeline);
- its settings (`GatewayConfig`: default, help and parser per field,
  localmodel.settings), each a flag that is also read from the variable
  LOCALMODEL_GATEWAY_<FLAG>. The gateway parses them (gateway/config.py); the
  renderer sets them (`gateway_variables`), so both derive the variables'
  names from this one declaration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from localmodel import engines
from localmodel.gateway_contract.headers import ASLEEP_RETRY_AFTER_S
from localmodel.gateway_contract.marks import router_key
from localmodel.printable import printable
from localmodel.settings import (
    ConfigError,
    flags,
    http_url,
    listen,
    non_negative_int,
    non_negative_seconds,
    one_of,
    positive_int,
    positive_seconds,
    setting,
    text,
)
from localmodel.settings import (
    env_name as _env_name,
)

# ---- where it answers -------------------------------------------------------------

GATEWAY_PORT = 8080  # the pod's http port: the Service targets it
# The admin port: what the operator, Prometheus, doctor and timeline read. The
# model's Service does not expose it (a NetworkPolicy can keep it to the
# operator's namespace: spec.gateway.networkPolicy).
ADMIN_PORT = 8090  # not an engine's port (tests/render/test_admin_port.py)
READY_PATH = "/readyz"  # 200 once the engine serves the model and its speed is calibrated
HEALTH_PATH = "/healthz"  # 200 while the gateway runs
SLOTS_PATH = "/slots"  # slots, queue and the settings that shape them
# The session headers, keys and idle time: gateway_contract/headers.py.
# On the admin port only:
METRICS_PATH = "/metrics"  # Prometheus text, every name starting with METRIC_PREFIX
SPEED_PATH = "/speed"  # this replica's calibration and recent speed (the controller reads it)
LEDGER_PATH = "/ledger"  # the ledger's records (timeline reads them); since, caller, priority
# POST, the operator's signed close before it gives the node away (gateway/door.py)
YIELD_PATH = "/yield"
ADMIN_PATHS = (METRICS_PATH, SPEED_PATH, LEDGER_PATH)  # the GETs; YIELD_PATH is there too

# Every gateway metric's name starts so (doctor reads them).
METRIC_PREFIX = "localmodel_gateway_"

# ---- the ledger's record ----------------------------------------------------------

DEFAULT_LEDGER_SIZE = 10_000  # records kept (docs/gateway.md, The ledger: memory per record)


@dataclass(frozen=True, slots=True)
class Behind:
    """One wait a request was queued behind: whose, at which priority, how long."""

    caller: str
    priority: str
    seconds: float


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One request's line in the ledger. Seconds throughout; None: not known
    (the request never got that far, or the engine did not say)."""

    request_id: str
    caller: str
    session: str | None
    priority: str
    route: str
    model: str
    outcome: str
    status: int
    served_by: str
    arrival: float  # wall clock, seconds since the epoch
    duration: float | None
    queue_wait: float | None
    slot_start: float | None  # seconds after arrival the slot was granted
    slot_seconds: float | None
    ttft: float | None
    caller_gone: float | None  # seconds after arrival the caller left
    abandoned_seconds: float | None  # slot held after the caller had gone
    behind: tuple[Behind, ...]
    prompt_tokens: int | None
    cached_tokens: int | None
    evaluated_tokens: int | None
    prefill_seconds: float | None
    generated_tokens: int | None
    decode_seconds: float | None
    rewrite: bool | None  # None: no session to compare with
    reread_tokens: int | None
    reread_seconds: float | None
    routed: str | None = None  # the router's decision (ROUTE_HEADER); None: not routed
    # Seconds the router held it while its model woke (its signed X-LocalModel-Woke);
    # None: not held. Before `arrival`: the wait is not in `duration`.
    wake_wait_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "caller": self.caller,
            "session": self.session,
            "priority": self.priority,
            "route": self.route,
            "model": self.model,
            "outcome": self.outcome,
            "status": self.status,
            "served_by": self.served_by,
            "arrival": round(self.arrival, 3),
            "duration_s": _r(self.duration),
            "queue_wait_s": _r(self.queue_wait),
            "slot_start_s": _r(self.slot_start),
            "slot_s": _r(self.slot_seconds),
            "ttft_s": _r(self.ttft),
            "caller_gone_s": _r(self.caller_gone),
            "abandoned_s": _r(self.abandoned_seconds),
            "waited_behind": [
                {"caller": b.caller, "priority": b.priority, "seconds": _r(b.seconds)}
                for b in self.behind
            ],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "evaluated_tokens": self.evaluated_tokens,
            "prefill_s": _r(self.prefill_seconds),
            "generated_tokens": self.generated_tokens,
            "decode_s": _r(self.decode_seconds),
            "rewrite": self.rewrite,
            "reread_tokens": self.reread_tokens,
            "reread_s": _r(self.reread_seconds),
            "routed": self.routed,
            "wake_wait_s": _r(self.wake_wait_s),
        }


def _r(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def ledger_document(
    size: int, recorded: int, kept: int, entries: Iterable[LedgerEntry]
) -> dict[str, Any]:
    """The body of GET /ledger: the ring's size, the records made since start,
    those the ring dropped, and the records asked for."""
    return {
        "size": size,
        "recorded": recorded,
        "dropped": recorded - kept,
        "entries": [e.as_json() for e in entries],
    }


# What a reader takes of one gateway's /ledger (the gateway's image may be the
# tenant's): its ring holds DEFAULT_LEDGER_SIZE records of about 1 KB.
MAX_LEDGER_BYTES = 64 * 1024**2
MAX_ENTRIES = 100_000
_MAX_TEXT = 200  # characters kept of any string in an entry
_MAX_KEY = 64
MAX_BEHIND_READ = 16  # whom one entry waited behind, as read back


def parse_entries(doc: Any) -> list[dict[str, Any]]:
    """The entries of a /ledger document as read back (timeline), each as
    data that is safe to print: every string bounded and cleaned
    (localmodel.printable), every number finite (else None), `waited_behind`
    a short list of such objects, nothing else nested. Raises ValueError
    naming what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise ValueError("not a ledger document: no `entries` list")
    if len(doc["entries"]) > MAX_ENTRIES:
        raise ValueError(f"more than {MAX_ENTRIES} entries")
    out = []
    for index, entry in enumerate(doc["entries"]):
        if not isinstance(entry, dict):
            raise ValueError(f"entries[{index}] is not an object")
        out.append(_clean_entry(entry))
    return out


def _clean_entry(entry: dict[Any, Any]) -> dict[str, Any]:
    clean = {printable(str(k), _MAX_KEY): _clean_value(v) for k, v in entry.items()}
    if "wake_wait_s" in clean:
        clean["wake_wait_s"] = _wake_wait(clean["wake_wait_s"])
    if "waited_behind" not in entry:
        return clean
    behind = entry["waited_behind"]
    clean["waited_behind"] = [
        {printable(str(k), _MAX_KEY): _clean_value(v) for k, v in b.items()}
        for b in (behind if isinstance(behind, list) else [])[:MAX_BEHIND_READ]
        if isinstance(b, dict)
    ]
    return clean


# The longest wake wait a reader believes: the router holds an hour at most
# (headers.MAX_WOKE_MS); a gateway's image is the tenant's, so it may say anything.
MAX_WAKE_WAIT_S = 3600.0


def _wake_wait(value: Any) -> float | None:
    """A wake wait as read back: seconds from 0 to MAX_WAKE_WAIT_S, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value <= MAX_WAKE_WAIT_S else None


def _clean_value(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return printable(value, _MAX_TEXT)
    return None  # nested values other than waited_behind: not the ledger's


def merge(documents: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Entries of several gateways in arrival order (no number: first)."""
    merged = [e for entries in documents for e in entries]

    def arrival(entry: dict[str, Any]) -> float:
        value = entry.get("arrival")
        return float(value) if isinstance(value, int | float) else 0.0

    merged.sort(key=arrival)
    return merged


# ---- its settings -----------------------------------------------------------------

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


def _budget(flag: str, raw: str) -> tuple[int, float]:
    requests, sep, seconds = raw.strip().partition("/")
    try:
        n, window = int(requests), float(seconds)
    except ValueError:
        n, window = -1, math.nan
    if not sep or n < 0 or not 0 < window <= 31 * 86400:
        raise ConfigError(flag, f"expected REQUESTS/SECONDS such as 100/3600, got {raw!r}")
    return n, window


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's settings: a declaration table, one field per setting (default, help,
    parser)."""

    upstream: str = setting(
        f"http://127.0.0.1:{engines.DEFAULT.PORT}", "engine base URL", metavar="URL",
        parse=http_url,
    )
    # The engines the gateway fronts, by their own names (localmodel.engines).
    engine: str = setting(
        engines.DEFAULT.NAME, " | ".join(engines.NAMES), metavar="NAME",
        parse=one_of(*engines.NAMES),
    )
    listen_host: str = setting(
        "0.0.0.0", "where the gateway listens", flag="listen", also=("listen_port",),
        metavar="HOST:PORT", parse=listen,
    )
    listen_port: int = GATEWAY_PORT  # set by --listen, with listen_host
    admin_listen: tuple[str, int] | None = setting(
        None, "where /metrics, /speed and /ledger are served (default {default})",
        shown_default=f"the --listen host, port {ADMIN_PORT}; any free port with --listen port 0",
        metavar="HOST:PORT", parse=listen,
    )
    # API keys (gateway/keys.py): with a file, every inference route needs one.
    keys_file: str = setting(
        "", "JSON file of API keys (their SHA-256, caller and rights; docs/gateway.md, "
        "API keys); reloaded when it changes", shown_default="none: no keys asked",
        metavar="PATH", parse=text,
    )
    # The router's public key (gateway_contract/marks.py): with it, the marks the router
    # signs for this replica (pod-namespace, pod-name) make a session owned
    # here and let /slots list session keys; without it, no caller can.
    router_key: str = setting(
        "", "the router's Ed25519 public key (base64 of its 32 raw bytes), which signs "
        "owned sessions and /slots reads (docs/router.md)",
        shown_default="none: owned-session marks ignored, no session keys in /slots",
        metavar="BASE64", parse=router_key,
    )
    pod_namespace: str = setting(
        "", "this replica's namespace, as the router's marks name it", metavar="NS", parse=text
    )
    pod_name: str = setting(
        "", "this replica's pod name, as the router's marks name it", metavar="NAME", parse=text
    )
    overflow_budget: tuple[int, float] | None = setting(
        None, "overflowed requests per window (REQUESTS/SECONDS, e.g. 100/3600) for each "
        "key without its own overflowBudget, and for all callers without a key together",
        shown_default="none: unbounded", metavar="N/S", parse=_budget,
    )
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
    # What a real chat needs: a context of N tokens holds at most about 4N
    # bytes of text, so a 128k-token context (the longest of the common open
    # models; a LocalModel's default is 8192) is about 512 KiB; twice that
    # leaves room for JSON escapes and the messages' structure. The parse
    # costs up to ~25 times a body, so this limit sizes the gateway's peak
    # memory: measured about 40 MiB + 30 x the limit, 84 MiB at 1 MiB, under
    # its pod's 256 MiB (docs/benchmarks.md, Hostile bodies).
    max_body_bytes: int = setting(
        1024 * 1024, "request body limit, 413 above it", metavar="N", parse=positive_int
    )
    # Each message costs its chat template's role markers (a few tokens), so
    # 2048 messages are already ~8k tokens of markup alone.
    max_messages: int = setting(
        2048, "messages one chat request may carry, 413 above it", metavar="N",
        parse=positive_int,
    )
    # One message may hold a whole 128k-token context's text (about 4 bytes a token).
    max_string_bytes: int = setting(
        512 * 1024, "size of any one JSON string in a request body (UTF-8), 413 above it",
        metavar="N", parse=positive_int,
    )
    # A body being received holds up to twice its size (aiohttp's buffer and
    # the bytes); the parse (up to ~25 times a body's size) runs on the event
    # loop, one at a time whatever this says. Four turns hold at most ~8 MiB at
    # the default body limit, and a body limit raised for images cannot
    # multiply by the queue's depth. Measured at 1 MiB, 1 to 16 turns moved
    # the peak only from 81 to 85 MiB and a normal chat's wait behind hostile
    # bodies from 0.28 to 0.18 s (docs/benchmarks.md, Hostile bodies).
    body_reads: int = setting(
        4, "request bodies read and parsed at once (others wait their turn)", metavar="N",
        parse=positive_int,
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
    # The close POST /yield grants (gateway/door.py): it reopens by itself unless a
    # signed call renews it within this time, so a crashed operator never leaves a
    # live pod refusing work.
    yield_lease: float = setting(
        60.0, "how long a close lasts without a renewing signed POST /yield "
        "(docs/gateway.md, Sleep and yield)", metavar="S", parse=positive_seconds,
    )
    # The doorman (`localmodel gateway --doorman`, gateway/doorman.py) tells a
    # caller of a released model where to go and when to come back.
    router_url: str = setting(
        "", "the router's address a doorman names to its callers (e.g. "
        "http://localmodel-router.localmodel:8080)", shown_default="none: not named",
        metavar="URL", parse=http_url,
    )
    wake_seconds: int | None = setting(
        None, "a doorman's Retry-After: its model's last wake, in whole seconds",
        shown_default=f"{ASLEEP_RETRY_AFTER_S}, a closed gateway's", metavar="S",
        parse=positive_int,
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

    @property
    def admin_address(self) -> tuple[str, int]:
        """Where the admin port listens (see --admin-listen)."""
        if self.admin_listen is not None:
            return self.admin_listen
        return self.listen_host, ADMIN_PORT if self.listen_port else 0


FLAGS = flags(GatewayConfig)


def env_name(flag: str) -> str:
    """The variable the gateway reads a flag from: LOCALMODEL_GATEWAY_<FLAG>."""
    return _env_name(ENV_PREFIX, flag)


def gateway_variables(values: Mapping[str, str]) -> dict[str, str]:
    """The variables that give the gateway these flag values (by flag name, in
    their order); KeyError for a flag the gateway does not declare."""
    unknown = [name for name in values if name not in FLAGS]
    if unknown:
        raise KeyError(f"not a flag of `localmodel gateway`: {', '.join(unknown)}")
    return {env_name(name): value for name, value in values.items()}

