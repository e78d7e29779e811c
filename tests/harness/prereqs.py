"""What a test run may rely on being built.

`hack/test.sh` runs the tiers that need only the tools (hack/build-tools.sh)
while the engines and the node images (hack/build-engines.sh,
hack/build-images.sh) are still building: it deselects the tests marked
`engine` or `realnode` and sets ENGINES_BUILDING in that run's environment.
A test in that run that reaches for an engine part or an image fails here,
with the marker to add, rather than passing on a warm machine and failing on a
cold one.
"""

from __future__ import annotations

import os

ENGINES_BUILDING = "LOCALMODEL_ENGINES_BUILDING"
# The markers of the tests that need the engines or the images (pyproject.toml
# describes them); hack/test.sh's two runs select on them.
ENGINE_MARKERS = ("engine", "realnode")


class EnginesBuildingError(RuntimeError):
    """A test that is not marked as needing the engines asked for one."""


def require_engines(what: str) -> None:
    """Raise EnginesBuildingError if this run is the one before the engines are built."""
    if os.environ.get(ENGINES_BUILDING):
        raise EnginesBuildingError(
            f"{what}: this run does not wait for the engines and images "
            f"({ENGINES_BUILDING} is set: hack/test.sh runs it while they build). "
            "Mark the test `pytest.mark.engine` (or `realnode` if it joins the "
            "real node) so that it runs after them."
        )
