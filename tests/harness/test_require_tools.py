"""A binary that is not built fails the tests that need it, naming it and the build
command (the chart, gitops and e2e tiers take the path where it is built)."""

from __future__ import annotations

import pytest

from tests.harness.fixtures import tools_or_fail

pytestmark = pytest.mark.unit


def test_a_missing_binary_fails_the_test_with_the_build_command() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        tools_or_fail(("helm", "no-such-tool"))
    assert "no-such-tool (?)" in str(failed.value)
    assert "hack/build-tools.sh" in str(failed.value)
    assert not failed.value.pytrace
