"""One version for users to follow (issue 31): the Python package's
(pyproject.toml and `localmodel.__version__`), the chart's `version` and
`appVersion`, the operator image's tag (the chart's default and the operator's
own default image, which hack/build-images.sh tags with the appVersion), and
CHANGELOG.md's newest entry."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from localmodel import __version__
from localmodel.render.names import DEFAULT_OPERATOR_IMAGE
from tests.harness.tools import REPO_ROOT

pytestmark = pytest.mark.unit

CHART = REPO_ROOT / "charts" / "localmodel-operator"


def test_the_versions_agree() -> None:
    package = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    found = {"pyproject.toml": package, "localmodel.__version__": __version__,
             "Chart.yaml version": chart["version"], "Chart.yaml appVersion": chart["appVersion"],
             "the chart's image tag": tag,
             "the operator's default image": DEFAULT_OPERATOR_IMAGE.rsplit(":", 1)[1]}
    assert len(set(found.values())) == 1, found
    assert f"{values['image']['repository']}:{package}" == DEFAULT_OPERATOR_IMAGE


def test_build_images_tags_with_the_app_version() -> None:
    script = (REPO_ROOT / "hack" / "build-images.sh").read_text()
    assert "appVersion" in script  # the tag is read from Chart.yaml, not written twice


def test_the_changelog_starts_with_this_version() -> None:
    text = (REPO_ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", text, re.MULTILINE)
    assert versions and versions[0] == __version__, versions
    assert len(versions) == len(set(versions))
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))),
                              reverse=True)
