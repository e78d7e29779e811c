"""What a test run may rely on being built.

`hack/test.sh` does not wait for every build before it tests. It runs, in
order:
  1. the tiers that need only the tools (hack/build-tools.sh), while the
     engines and images still build: ENGINES_BUILDING=all;
  2. the tests marked `llama`, once llama-server, llama-bench, the model and
     every image but Ollama's are built, while Ollama and its image still
     build: ENGINES_BUILDING=ollama. Run 1 runs beside it (both start as soon
     as what they need is built), so the real-node tests that need no Ollama
     run here rather than after the Ollama build;
  3. the other tests marked `engine` or `realnode`, when everything is built.
In runs 1 and 2, a test that reaches for a part or an image not built yet
fails here, naming the marker to add, rather than passing on a warm machine
and failing on a cold one. In run 2 that holds on a warm machine too: the real
node is given only the images run 2 may use.
"""

from __future__ import annotations

import os
from typing import NoReturn

ENGINES_BUILDING = "LOCALMODEL_ENGINES_BUILDING"
# hack/build-engines.sh's parts that run 2 may use (its --print names).
LLAMA_PARTS = frozenset({"llama-server", "llama-bench", "model"})
# hack/build-images.sh's images (its NAMES, in its order; a test checks they
# agree), and those run 2 may use: all but Ollama's.
IMAGE_NAMES = ("operator", "ollama", "llama-server", "pause", "helper")
LLAMA_IMAGES = frozenset(IMAGE_NAMES) - {"ollama"}
# The values of ENGINES_BUILDING: what the run must not use, and how a test waits for it.
BUILDING = {
    "all": "Mark the test `pytest.mark.engine` (or `realnode` if it joins the real "
           "node) so that it runs after the engines and images are built.",
    "ollama": "Take its `llama` marker off (keep `engine` or `realnode`): `llama` tests "
              "run before Ollama and its image are built.",
}


class EnginesBuildingError(RuntimeError):
    """A test asked for an engine part or an image that its run does not wait for."""


def _refuse(what: str, building: str) -> NoReturn:
    raise EnginesBuildingError(
        f"{what}: this run does not wait for it ({ENGINES_BUILDING}={building}: "
        f"hack/test.sh runs it while that still builds). {BUILDING.get(building, BUILDING['all'])}"
    )


def require_part(name: str) -> None:
    """Raise EnginesBuildingError if this run may not use engine part `name`."""
    building = os.environ.get(ENGINES_BUILDING, "")
    if building and not (building == "ollama" and name in LLAMA_PARTS):
        _refuse(f"hack/build-engines.sh's {name}", building)


def given_images(names: tuple[str, ...] = ()) -> tuple[str, ...]:
    """hack/build-images.sh's images of `names` (empty: every one) this run may
    use, as names to pass it (empty: every one); EnginesBuildingError if one
    named is not given (with no names, in run 2: all that are)."""
    building = os.environ.get(ENGINES_BUILDING, "")
    if not building:
        return names
    if building == "ollama":
        wanted = names or tuple(n for n in IMAGE_NAMES if n in LLAMA_IMAGES)
        refused = [n for n in wanted if n not in LLAMA_IMAGES]
        if not refused:
            return wanted
        _refuse(f"hack/build-images.sh's {', '.join(refused)} image", building)
    _refuse("hack/build-images.sh's images", building)
