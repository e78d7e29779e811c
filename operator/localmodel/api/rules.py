"""The LocalModel API's cross-field rules, each declared once with both halves.

Every rule carries the CEL expression the API server enforces *and* the Python
check the CLI and operator enforce, with one message for both
(`localmodel.api.checks.CrossFieldRule`). The models in `localmodel.api.spec`
enforce their set in a validator; `localmodel.crd` writes the same sets into
the CRD, in this order.

The Python checks compare with the values the CEL compares with ('Exists',
'disabled'): the enumerations are `StrEnum`s, so a member equals its value.
The engine-scoped rules are built from each engine's facts (`spec_rules`): an
engine that has no use for a spec field gets a rule refusing it, so adding an
engine adds no rule here. Python enforces them for every registered engine
(`localmodel.engines.FACTS`, `SPEC_RULES`); the CRD carries the shipped
engines' (`localmodel.engines.SHIPPED`, localmodel.crd), so an out-of-tree
engine does not enter it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from localmodel.api.checks import CrossFieldRule, cel_string, go_duration_ns
from localmodel.api.engine import DEFAULT_ENGINE
from localmodel.engines import FACTS, EngineFacts

MAX_CPU = 1024
CPU_MESSAGE = f"must be a positive integer or 'node' (at most {MAX_CPU} CPUs)"



def managed_env(engines: Sequence[EngineFacts]) -> tuple[str, ...]:
    """Environment variables the operator sets from the spec and its rules, as
    each engine lists them (localmodel.engines). A user setting one of them
    would silently undo a rule, so the API rejects it. Each once: two engines
    may manage the same variable (LLAMA_ARG_CACHE_RAM)."""
    return tuple(dict.fromkeys(n for f in engines for n in f.MANAGED_ENV))


MANAGED_ENV: tuple[str, ...] = managed_env(FACTS)

# Variables that choose the code the engine runs: the dynamic loader's (LD_PRELOAD,
# LD_LIBRARY_PATH, LD_AUDIT, ...) and PATH. The AMX guard deletes a CPU library and pins
# `/bin/ollama`; a user LD_PRELOAD or LD_LIBRARY_PATH could load that code back, and PATH
# picks the binaries the start scripts run. Rejected like MANAGED_ENV (docs/validation.md).
LOADER_ENV: tuple[str, ...] = ("PATH",)
LOADER_ENV_PREFIX = "LD_"

# The last path segment of a URL, when it names a GGUF file (query and fragment aside).
GGUF_URL_FILE_PATTERN = r"/([A-Za-z0-9][A-Za-z0-9._-]*[.]gguf)([?#].*)?$"


GGUF_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel=f"has(self.file) || self.url.matches('{GGUF_URL_FILE_PATTERN}')",
        message="the URL does not end in a .gguf file name: set gguf.file",
        check=lambda g: bool(g.file) or re.search(GGUF_URL_FILE_PATTERN, g.url) is not None,
        field_path="file",
    ),
)


TOLERATION_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="self.operator == 'Exists' || (has(self.key) && self.key != '')",
        message="a toleration without a key must use operator Exists",
        check=lambda t: t.operator == "Exists" or bool(t.key),
        field_path="key",
    ),
    CrossFieldRule(
        cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
        message="a toleration with operator Exists must not set a value",
        check=lambda t: t.operator != "Exists" or not t.value,
        field_path="value",
    ),
    CrossFieldRule(
        # As Kubernetes validates a pod's tolerations (ValidateTolerations).
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="tolerationSeconds is only valid with effect NoExecute",
        check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        field_path="effect",
    ),
)


GATEWAY_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="!has(self.overflow) || !has(self.enabled) || self.enabled",
        message="overflow needs the gateway: set enabled to true or remove overflow",
        check=lambda g: g.overflow is None or g.enabled,
        field_path="overflow",
    ),
    CrossFieldRule(
        cel="!has(self.auth) || !has(self.enabled) || self.enabled",
        message="auth needs the gateway: set enabled to true or remove auth",
        check=lambda g: g.auth is None or g.enabled,
        field_path="auth",
    ),
)


# ---- spec.idle: sleep when idle ----------------------------------------------------

# `idle.after`: at least a minute (shorter sleeps more than it serves), at most a week.
IDLE_AFTER_MIN_S = 60
IDLE_AFTER_MAX_S = 7 * 24 * 3600


def _after_in_range(after: str) -> bool:
    ns = go_duration_ns(after)
    return ns is not None and IDLE_AFTER_MIN_S * 10**9 <= ns <= IDLE_AFTER_MAX_S * 10**9


IDLE_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        # CEL's duration() reads Go durations, as `go_duration_ns` does.
        cel=f"duration(self.after) >= duration('{IDLE_AFTER_MIN_S}s') "
        f"&& duration(self.after) <= duration('{IDLE_AFTER_MAX_S}s')",
        message="must be from 1m to 168h (7 days), e.g. 30m",
        check=lambda i: _after_in_range(i.after),
        field_path="after",
    ),
)

WINDOW_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="self.from != self.to",
        message="from and to must differ (a window of no time, or of a whole day, says "
        "nothing: remove it, or leave idle out for a model that never sleeps)",
        check=lambda w: w.from_ != w.to,
        field_path="to",
    ),
)

# The spec's rule for `idle`: the gateway signals idleness, closes and holds the ledger.
_IDLE_NEEDS_GATEWAY = CrossFieldRule(
    cel="!has(self.idle) || !has(self.gateway) || !has(self.gateway.enabled) "
    "|| self.gateway.enabled",
    message="idle needs the gateway (it tells when the model is idle, and closes it "
    "before it sleeps): set gateway.enabled to true or remove idle",
    check=lambda s: s.idle is None or s.gateway.enabled,
    field_path="idle",
)


# ---- the engine-scoped rules, from the engines' facts --------------------------------


def _cel_engine_is(name: str) -> str:
    """CEL: the engine is `name` (an absent engine or name means DEFAULT_ENGINE)."""
    named = f"self.engine.name == {cel_string(name)}"
    if name == DEFAULT_ENGINE:
        return f"(!has(self.engine) || !has(self.engine.name) || {named})"
    return f"(has(self.engine) && has(self.engine.name) && {named})"


def _owners(facts: list[EngineFacts]) -> str:
    """The engines a switch belongs to, as prose names its owner: "Ollama's"."""
    return " and ".join(f"{f.TITLE}'s" for f in facts)


def _needs_gguf(f: EngineFacts) -> CrossFieldRule:
    name = f.NAME
    return CrossFieldRule(
        cel=f"!{_cel_engine_is(name)} || has(self.gguf)",
        message=f"engine {name} serves a GGUF file: set gguf.url and gguf.sha256",
        check=lambda s: s.engine.name != name or s.gguf is not None,
        field_path="gguf",
    )


def _no_keep_alive(f: EngineFacts, engines: Sequence[EngineFacts]) -> CrossFieldRule:
    name, owners = f.NAME, _owners([o for o in engines if o.KEEP_ALIVE])
    return CrossFieldRule(
        cel=f"!{_cel_engine_is(name)} || !has(self.keepAlive) || self.keepAlive == '-1'",
        message=f"keepAlive is {owners}; {f.TITLE} always keeps its model loaded",
        check=lambda s: s.engine.name != name or s.keep_alive == "-1",
        field_path="keepAlive",
    )


def _no_safe_cpu_path(f: EngineFacts, engines: Sequence[EngineFacts]) -> CrossFieldRule:
    name, owners = f.NAME, _owners([o for o in engines if o.AMX_LIBRARIES])
    return CrossFieldRule(
        cel=f"!{_cel_engine_is(name)} || !has(self.placement) "
        "|| !has(self.placement.safeCpuPath) || !self.placement.safeCpuPath",
        message=f"placement.safeCpuPath is {owners} AMX workaround (its CPU libraries); "
        f"{f.TITLE} has no such switch here",
        check=lambda s: s.engine.name != name or not s.placement.safe_cpu_path,
        field_path="placement",
    )


def engine_rules(engines: Sequence[EngineFacts]) -> tuple[CrossFieldRule, ...]:
    """Each engine's refusals: a GGUF file where it serves only one, keepAlive
    and safeCpuPath (AMX's, so only where AMX is its concern: its
    `AMX_LIBRARIES`) where it has no use for them; grouped by field, engines in
    the given order."""
    return (
        *(_needs_gguf(f) for f in engines if f.NEEDS_GGUF),
        *(_no_keep_alive(f, engines) for f in engines if not f.KEEP_ALIVE),
        *(_no_safe_cpu_path(f, engines) for f in engines if not f.AMX_LIBRARIES),
    )


# ---- the spec's rules -----------------------------------------------------------------


def _loader(name: str) -> bool:
    return name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIX)


def spec_rules(engines: Sequence[EngineFacts]) -> tuple[CrossFieldRule, ...]:
    """The spec's rules with these engines' (every registered engine's for
    Python, the shipped engines' for the CRD)."""
    return (_CPU_RULE, *engine_rules(engines), _KV_RULE, _managed_env_rule(managed_env(engines)),
            *_SPEC_TAIL, _IDLE_NEEDS_GATEWAY)


_CPU_RULE = CrossFieldRule(
    cel="!has(self.cpu) || (type(self.cpu) == int ? self.cpu >= 1 && self.cpu <= "
    f"{MAX_CPU} : self.cpu == 'node')",
    message=CPU_MESSAGE,
    check=lambda s: s.cpu == "node" or (isinstance(s.cpu, int) and 1 <= s.cpu <= MAX_CPU),
    field_path="cpu",
)

_KV_RULE = CrossFieldRule(
    cel="!has(self.kvCache) || !has(self.flashAttention) "
    "|| !(self.kvCache in ['q8_0', 'q4_0'] && self.flashAttention == 'disabled')",
    message="a quantized kvCache needs flash attention: llama.cpp cannot create a "
    "quantized V cache without it; set flashAttention to auto or enabled, or kvCache "
    "to f16",
    check=lambda s: not (s.kv_cache.quantized and s.flash_attention == "disabled"),
    field_path="kvCache",
)


def _managed_env_rule(managed: tuple[str, ...]) -> CrossFieldRule:
    return CrossFieldRule(
        cel="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{n}'" for n in managed)
        + "]))",
        message="sets a variable the operator manages ("
        + ", ".join(managed)
        + "); use the matching spec field instead",
        check=lambda s: not any(e.name in managed for e in s.env),
        field_path="env",
    )


_SPEC_TAIL: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{n}'" for n in LOADER_ENV)
        + f"] || e.name.startsWith('{LOADER_ENV_PREFIX}')))",
        message="sets a variable that decides which code the engine runs ("
        + ", ".join(LOADER_ENV)
        + f", {LOADER_ENV_PREFIX}*): it could load a library a crash guard removed or "
        "run another binary than the image's; build an image instead",
        check=lambda s: not any(_loader(e.name) for e in s.env),
        field_path="env",
    ),
    CrossFieldRule(
        cel="!has(self.env) || self.env.all(a, self.env.exists_one(b, b.name == a.name))",
        message="each variable name may appear once",
        check=lambda s: len({e.name for e in s.env}) == len(s.env),
        field_path="env",
    ),
)

# Every registered engine's, as Python enforces them.
SPEC_RULES: tuple[CrossFieldRule, ...] = spec_rules(FACTS)
