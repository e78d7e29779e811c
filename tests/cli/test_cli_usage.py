"""`localmodel --help` lists exactly the commands that exist, and each one runs."""

from __future__ import annotations

import importlib
import re

import pytest

from localmodel.cli import COMMANDS, main, usage

pytestmark = pytest.mark.unit


def listed(text: str) -> list[str]:
    return re.findall(r"^  (\S+)  ", text.split("commands:\n", 1)[1], re.M)


def test_usage_lists_every_command_and_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert listed(out) == list(COMMANDS)
    for name, command in COMMANDS.items():
        assert f"  {name}" in out and command.summary in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_listed_command_resolves_to_a_function(name: str) -> None:
    command = COMMANDS[name]
    assert callable(getattr(importlib.import_module(command.module), command.func))


def test_an_unknown_command_exits_2_with_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor-who"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'doctor-who'" in err and usage() in err


def test_commands_run_through_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    assert capsys.readouterr().out.startswith("# Tuning rules")
