"""Settings written once: each field of a settings dataclass carries its
default, its flag's help and the parser of its value (`setting`); the flags,
their environment variables, their help lines and the parsing of raw values
are all read from the fields. Pure.

The value parsers shared by `localmodel gateway` and `localmodel run` live
here too, so a HOST:PORT or a number of seconds means one thing in both.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

Parser = Callable[[str, str], Any]  # (flag, raw value) -> value, or ConfigError
_SPEC = "localmodel.setting"


class ConfigError(ValueError):
    """A flag (or its environment variable) has a value we cannot use."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"--{flag}: {message}")
        self.flag = flag


class PortTaken(ConfigError):
    """A program cannot listen where a flag says (the port is taken, the
    address is not this machine's): said in one line naming the flag and the
    address, and the program exits 2, as for any flag's bad value."""

    def __init__(self, flag: str, host: str, port: int, exc: OSError) -> None:
        super().__init__(flag, f"cannot listen on {host}:{port}: {exc.strerror or exc}")


@dataclass(frozen=True)
class _Spec:
    """One setting's declaration: help, parser, flag and how it is read."""

    help: str
    parse: Parser
    metavar: str
    flag: str
    shown_default: str | None
    also: tuple[str, ...]
    fallback_env: tuple[str, ...]
    empty_is_value: bool
    choices: tuple[str, ...]
    repeatable: bool


def setting(
    default: Any,
    help: str,
    *,
    parse: Parser,
    metavar: str = "VALUE",
    flag: str = "",
    shown_default: str | None = None,
    also: tuple[str, ...] = (),
    fallback_env: tuple[str, ...] = (),
    empty_is_value: bool = False,
    choices: tuple[str, ...] = (),
    repeatable: bool = False,
    repr: bool = True,
) -> Any:
    """A dataclass field that is also a flag.

    help: what the flag sets. The default is told after it, "(default X)",
    unless the default is None or empty; a help text that says where the
    default goes writes `{default}` there instead.
    flag: the flag's name (default: the field's, `_` -> `-`).
    shown_default: the default as help tells it, when the value is not how
    a person would write it.
    also: further fields the parsed value (then a tuple) fills, in order.
    fallback_env: variables read, in order, when neither the flag nor its own
    variable is set.
    empty_is_value: an empty value is parsed (else it counts as not set).
    choices, repeatable: for command lines parsed by argparse.
    """
    spec = _Spec(
        help, parse, metavar, flag, shown_default, also, fallback_env, empty_is_value,
        choices, repeatable,
    )
    return dataclasses.field(default=default, repr=repr, metadata={_SPEC: spec})


@dataclass(frozen=True)
class Flag:
    """One flag, as its settings class declares it."""

    name: str  # without the dashes
    fields: tuple[str, ...]  # the fields its value fills
    default: Any  # one field's default, or a tuple of them
    spec: _Spec

    @property
    def help(self) -> str:
        """The help text with the default told."""
        spec = self.spec
        shown = spec.shown_default if spec.shown_default is not None else _show(self.default)
        if "{default}" in spec.help:
            return spec.help.format(default=shown)
        if self.default in (None, "", ()) and spec.shown_default is None:
            return spec.help
        return f"{spec.help} (default {shown})"

    def parse(self, raw: str) -> Any:
        return self.spec.parse(self.name, raw)

    def env_name(self, prefix: str) -> str:
        return env_name(prefix, self.name)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ":".join(_show(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flags(cls: type) -> dict[str, Flag]:
    """The flags a settings dataclass declares, by name, in field order."""
    out: dict[str, Flag] = {}
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None:
            continue
        names = (f.name, *spec.also)
        defaults = tuple(by_name[n].default for n in names)
        name = spec.flag or f.name.replace("_", "-")
        out[name] = Flag(name, names, defaults if spec.also else defaults[0], spec)
    return out


def env_name(prefix: str, flag: str) -> str:
    return prefix + flag.upper().replace("-", "_")


def field_values(declared: Mapping[str, Flag], raw: Mapping[str, str]) -> dict[str, Any]:
    """Raw values by flag -> parsed values by field (ConfigError names the flag)."""
    values: dict[str, Any] = {}
    for name, text in raw.items():
        flag = declared[name]
        value = flag.parse(text)
        if len(flag.fields) == 1:
            values[flag.fields[0]] = value
        else:
            values.update(zip(flag.fields, value, strict=True))
    return values


def pick(
    flag: Flag, given: str | None, env: Mapping[str, str], prefix: str
) -> str | None:
    """The raw value: the flag's, else its variable's, else a fallback
    variable's; None when none is set (an empty value counts as not set unless
    the flag parses it)."""
    value = given if given is not None else env.get(flag.env_name(prefix))
    if value is not None and (value != "" or flag.spec.empty_is_value):
        return value
    for name in flag.spec.fallback_env:
        fallback = env.get(name)
        if fallback:
            return fallback
    return None


def usage_lines(declared: Mapping[str, Flag], width: int = 92) -> str:
    """One entry per flag: `  --name METAVAR  help (default X)`, wrapped."""
    lines: list[str] = []
    for flag in declared.values():
        left = f"  --{flag.name} {flag.spec.metavar}"
        body = textwrap.wrap(flag.help, width - 24, break_on_hyphens=False)
        if len(left) > 23:
            lines.append(left)
        else:
            first = body.pop(0)
            lines.append(f"{left:<24}{first}")
        lines.extend(" " * 24 + line for line in body)
    return "\n".join(lines)


# ---- value parsers ----------------------------------------------------------


def int_at_least(minimum: int) -> Parser:
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


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_seconds(flag: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}")
    return value


def non_negative_seconds(flag: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(flag, f"expected a number of seconds >= 0, got {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(flag, f"expected a number of seconds >= 0, got {raw!r}")
    return value


def http_url(flag: str, raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            flag, f"expected an http(s) URL such as http://HOST:PORT, got {raw!r}"
        )
    return raw.rstrip("/")


def one_of(*choices: str) -> Parser:
    wanted = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]

    def parse(flag: str, raw: str) -> str:
        if raw not in choices:
            raise ConfigError(flag, f"expected {wanted}, got {raw!r}")
        return raw

    return parse


def text(flag: str, raw: str) -> str:
    return raw.strip()


def as_is(flag: str, raw: str) -> str:
    return raw


def listen(flag: str, raw: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets, [::]:8080) -> (host, port).
    Port 0 asks for any free port."""
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise ConfigError(flag, f"expected HOST:PORT, got {raw!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(flag, f"expected HOST:PORT with a numeric port, got {raw!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(flag, f"port out of range in {raw!r}")
    return host.strip("[]"), number


OFF = ("", "off", "0")


def listen_or_off(default_host: str) -> Parser:
    """`listen`, or off (empty, `off` or `0`: None); a PORT or :PORT alone
    listens on default_host."""

    def parse(flag: str, raw: str) -> tuple[str, int] | None:
        if raw in OFF:
            return None
        if ":" not in raw:
            raw = f"{default_host}:{raw}"
        elif raw.startswith(":"):
            raw = default_host + raw
        return listen(flag, raw)

    return parse


def split_words(flag: str, raw: str) -> tuple[str, ...]:
    """A list written with commas and/or spaces."""
    return tuple(word for word in raw.replace(",", " ").split() if word)


def parse_argv(declared: Mapping[str, Flag], argv: Sequence[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` -> raw values by flag; every flag takes
    a value. ConfigError for anything else."""
    raw: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(arg.lstrip("-") or arg, f"unexpected argument {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if name not in declared:
            raise ConfigError(name, "unknown flag")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(name, "missing value")
            value = args[i + 1]
            i += 1
        raw[name] = value
        i += 1
    return raw
