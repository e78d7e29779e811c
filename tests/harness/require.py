"""The harness's lookups for a test: what is not built fails the test (never skips it)."""

from __future__ import annotations

import pytest

from tests.harness.tools import TOOL_NAMES, Tools, ToolsMissingError, locate_tools


def tools_or_fail(required: tuple[str, ...] = TOOL_NAMES) -> Tools:
    """`locate_tools` for a fixture: a binary that is not built fails the test
    with the command that builds it, without a traceback."""
    try:
        return locate_tools(required)
    except ToolsMissingError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)
