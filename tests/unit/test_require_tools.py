"""A binary that is not built fails the tests that need it, naming it and the build command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.harness.fixtures import tools_or_fail
from tests.harness.tools import BUILD_SCRIPT


def test_a_missing_binary_fails_the_test_with_the_build_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALMODEL_CACHE", str(tmp_path))  # an empty cache: nothing is built
    with pytest.raises(pytest.fail.Exception) as failed:
        tools_or_fail(("helm",))
    assert "helm (" in str(failed.value)
    assert "hack/build-tools.sh" in str(failed.value)
    assert not failed.value.pytrace


def test_built_binaries_are_returned_by_name(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALMODEL_CACHE", str(tmp_path))
    printed = subprocess.run([str(BUILD_SCRIPT), "--print"], capture_output=True, text=True,
                             check=True).stdout
    kubeconform = Path(next(line.split("=", 1)[1] for line in printed.splitlines()
                            if line.startswith("kubeconform=")))
    kubeconform.parent.mkdir(parents=True)
    kubeconform.write_text("#!/bin/sh\n")
    kubeconform.chmod(0o755)
    assert tools_or_fail(("kubeconform",))["kubeconform"] == kubeconform
