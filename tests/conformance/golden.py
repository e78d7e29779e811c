"""Golden renders of a test-only engine, kept in its own folder: every
`golden/<stem>.yaml` (LocalModels) of the engine's package rendered on the
examples' nodes with each of the shipped goldens' option sets
(tests/golden/render.py) is `golden/<stem>--<options>.json` there. A shipped
engine's goldens are tests/golden/render/ (tests/render/test_render_golden.py).

    python -m tests.conformance.golden --write NAME   # regenerate (a reviewed change)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localmodel.commands import parse_models, parse_nodes
from tests.conformance.subjects import package_dir
from tests.golden.render import NODE_FILES, OPTIONS, ROOT, encode, rendered


def golden_dir(name: str) -> Path:
    return package_dir(name) / "golden"


def cases(name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file stem, what the renderer gives) for each model file x option set."""
    nodes = parse_nodes([str(ROOT / "examples" / f"{n}.yaml") for n in NODE_FILES])
    for source in sorted(golden_dir(name).glob("*.yaml")):
        models = parse_models([str(source)])
        for options_name, options in OPTIONS.items():
            yield f"{source.stem}--{options_name}", rendered(models, nodes, options)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--write":
        print(__doc__, file=sys.stderr)
        return 2
    out = golden_dir(argv[1])
    for old in out.glob("*.json"):
        old.unlink()
    n = 0
    for stem, value in cases(argv[1]):
        (out / f"{stem}.json").write_text(encode(value))
        n += 1
    print(f"wrote {n} golden files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
