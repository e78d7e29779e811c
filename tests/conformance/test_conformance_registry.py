"""The suite's subjects are the registry's engines: every package under
tests/engines/ is registered for the session (tests/conftest.py, through the
variable the registry reads), after the shipped ones, and none is named here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localmodel import engines
from localmodel.engines.registry import ENGINES
from tests import engines as test_engines
from tests.conformance.subjects import NAMES

pytestmark = pytest.mark.unit


def test_every_test_only_engine_package_is_registered_after_the_shipped_ones() -> None:
    assert test_engines.ENV == engines.ENV
    named = os.environ[engines.ENV].split(",")
    assert set(test_engines.packages()) <= set(named)
    packages = [engines.package(f) for f in engines.FACTS]
    shipped = len(engines.SHIPPED)
    assert packages[:shipped] == [engines.package(f) for f in engines.SHIPPED]
    assert set(test_engines.packages()) <= set(packages[shipped:])
    assert set(NAMES) == set(ENGINES) == set(engines.NAMES)


def test_a_program_a_test_starts_from_any_directory_finds_the_test_only_engines(
        tmp_path: Path) -> None:
    """What registration leaves in the environment is enough for a program
    started elsewhere (the kubectl plugin runs from its own directory): it
    imports the registry and finds every test-only engine, as the session does."""
    environ = {k: v for k, v in os.environ.items() if k not in (engines.ENV, "PYTHONPATH")}
    environ["PYTHONPATH"] = str(Path(engines.__file__).resolve().parents[2])  # operator/
    test_engines.register(environ)
    out = subprocess.run(
        [sys.executable, "-c", "from localmodel import engines; print(*engines.NAMES)"],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == list(engines.NAMES)
