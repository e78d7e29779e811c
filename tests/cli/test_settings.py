"""Settings written once (localmodel/settings.py): the gateway's and the
operator's flags, their defaults, their help and the docs tables all come from
one declaration per setting, and HOST:PORT means one thing in both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localmodel import __version__, gateway_contract
from localmodel.controller import config as operator_config
from localmodel.gateway import config as gateway_config
from localmodel.settings import ConfigError, Flag, listen, listen_or_off

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),  # any free port
        ("[::1]:9090", ("::1", 9090)),
        ("[::]:65535", ("::", 65535)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_one_listen_parser_for_gateway_and_operator(raw: str, want: tuple[str, int]) -> None:
    assert listen("listen", raw) == want
    gw = gateway_config.parse_config(["--listen", raw], {})
    assert (gw.listen_host, gw.listen_port) == want
    op = operator_config.parse_config(["--metrics-listen", raw], {})
    assert op.metrics_listen == want


@pytest.mark.parametrize("raw", ["8080", ":8080", "host:http", "host:", "host:65536", "h:-1"])
def test_listen_refuses_what_is_not_host_and_port(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        listen("listen", raw)
    assert info.value.flag == "listen" and repr(raw) in str(info.value)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("off", None), ("0", None), ("", None), ("9090", ("0.0.0.0", 9090)),
     (":9090", ("0.0.0.0", 9090)), ("[::]:9090", ("::", 9090))],
)
def test_the_operator_listens_off_or_on_a_bare_port(
    raw: str, want: tuple[str, int] | None
) -> None:
    assert listen_or_off("0.0.0.0")("metrics-listen", raw) == want
    env = {"LOCALMODEL_HEALTH_LISTEN": raw}
    assert operator_config.parse_config([], env).health_listen == want


def _shown(flag: Flag) -> str | None:
    """The declared default as a literal, or None when it is told in words."""
    if flag.spec.shown_default is not None or flag.default in (None, "", ()):
        return None
    value = flag.default
    if isinstance(value, tuple):
        return ":".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


FLAG_SETS = {"gateway": gateway_contract.FLAGS, "operator": operator_config.FLAGS}


@pytest.mark.parametrize("which", list(FLAG_SETS))
def test_help_tells_each_declared_default(which: str) -> None:
    for flag in FLAG_SETS[which].values():
        shown = _shown(flag)
        if shown is not None:
            told = flag.help.split("(default ", 1)[-1]
            assert "(default " in flag.help and shown in told, flag.name


def test_gateway_usage_and_operator_help_are_read_from_the_declarations() -> None:
    for flag in gateway_contract.FLAGS.values():
        assert f"--{flag.name} {flag.spec.metavar}" in gateway_config.USAGE
        assert " ".join(flag.help.split()[:4]) in " ".join(gateway_config.USAGE.split())
    text = " ".join(operator_config._parser().format_help().split())
    for flag in operator_config.FLAGS.values():
        assert f"--{flag.name}" in text and " ".join(flag.help.split()) in text


def test_every_setting_but_the_secret_and_the_derived_has_a_flag() -> None:
    gw = {f for flag in gateway_contract.FLAGS.values() for f in flag.fields}
    assert set(gateway_contract.GatewayConfig.__dataclass_fields__) - gw == {"overflow_api_key"}
    op = {f for flag in operator_config.FLAGS.values() for f in flag.fields}
    assert set(operator_config.OperatorConfig.__dataclass_fields__) - op == {
        "renew_seconds", "debounce_seconds", "max_delay_seconds", "write_concurrency"
    }


def _doc_flags(doc: str) -> dict[str, str]:
    """The flags table of a doc: flag name -> its default cell, backticks kept."""
    table: dict[str, str] = {}
    for line in doc.splitlines():
        cells = re.split(r"(?<!\\)\|", line)  # a cell may hold an escaped \|
        name = re.match(r" `--([a-z-]+)", cells[1]) if len(cells) > 3 else None
        if name:
            table[name.group(1)] = cells[2].strip()
    return table


@pytest.mark.parametrize(
    ("which", "doc"), [("gateway", "docs/gateway.md"), ("operator", "docs/operator.md")]
)
def test_the_docs_flag_table_lists_the_declared_flags_and_defaults(which: str, doc: str) -> None:
    declared = FLAG_SETS[which]
    documented = _doc_flags((ROOT / doc).read_text())
    assert set(documented) == set(declared)
    for name, flag in declared.items():
        shown = _shown(flag)
        if shown is not None:
            cell = documented[name].replace("<version>", __version__)
            assert f"`{shown}`" in cell, (doc, name, cell)
