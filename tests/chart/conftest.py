"""The chart tier's shared fixture: the pinned helm."""

from __future__ import annotations

import pytest

from tests.harness import Tools
from tests.harness.fixtures import tools_or_fail


@pytest.fixture(scope="session")
def tools() -> Tools:
    return tools_or_fail(("helm",))
