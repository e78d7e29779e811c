"""What a test run may rely on being built.

`hack/test.sh` does not wait for every build before it tests. It runs, in
order:
  1. the tiers that need only the tools (hack/build-tools.sh), while the
     engines and images still build: ENGINES_BUILDING=all;
  2. the tests marked `llama`, once llama-server, llama-bench and the model
     are built, while Ollama and the engine images still build:
     ENGINES_BUILDING=ollama;
  3. the other tests marked `engine` or `realnode`, when everything is built.
In runs 1 and 2, a test that reaches for a part or an image not built yet
fails here, naming the marker to add, rather than passing on a warm machine
and failing on a cold one.
"""

from __future__ import annotations

import os

ENGINES_BUILDING = "LOCALMODEL_ENGINES_BUILDING"
# hack/build-engines.sh's parts that run 2 may use (its --print names).
LLAMA_PARTS = frozenset({"llama-server", "llama-bench", "model"})
# The values of ENGINES_BUILDING: what the run must not use, and how a test waits for it.
BUILDING = {
    "all": "Mark the test `pytest.mark.engine` (or `realnode` if it joins the real "
           "node) so that it runs after the engines and images are built.",
    "ollama": "Take its `llama` marker off (keep `engine`): `llama` tests run before "
              "Ollama and the images are built.",
}


class EnginesBuildingError(RuntimeError):
    """A test asked for an engine part or an image that its run does not wait for."""


def _refuse(what: str, building: str) -> None:
    raise EnginesBuildingError(
        f"{what}: this run does not wait for it ({ENGINES_BUILDING}={building}: "
        f"hack/test.sh runs it while that still builds). {BUILDING.get(building, BUILDING['all'])}"
    )


def require_part(name: str) -> None:
    """Raise EnginesBuildingError if this run may not use engine part `name`."""
    building = os.environ.get(ENGINES_BUILDING, "")
    if building and not (building == "ollama" and name in LLAMA_PARTS):
        _refuse(f"hack/build-engines.sh's {name}", building)


def require_images() -> None:
    """Raise EnginesBuildingError if this run may not use hack/build-images.sh's images."""
    building = os.environ.get(ENGINES_BUILDING, "")
    if building:
        _refuse("hack/build-images.sh's images", building)
