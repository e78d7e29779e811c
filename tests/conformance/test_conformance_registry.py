"""The suite's subjects are the registry's engines: every package under
tests/engines/ is registered for the session (tests/conftest.py, through the
variable the registry reads), after the shipped ones, and none is named here."""

from __future__ import annotations

import os

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
