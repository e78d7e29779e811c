"""The renderer's golden outputs: every example rendered against every node
fixture, with the digests the operator compares (pod spec hashes, applied
hashes). Committed before the render package and the engine adapters moved
code, so a move that changes one byte of a pod (and would roll every pod on
upgrade) fails `tests/render/test_render_golden.py`.

    python -m tests.golden.render --write   # regenerate (a reviewed change)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localmodel.api import LocalModel, parse_local_model
from localmodel.commands import parse_models, parse_nodes
from localmodel.desired import desired_state
from localmodel.facts.machine import read_machine
from localmodel.facts.node import NodeFacts, from_node
from localmodel.manifest import documents
from localmodel.render import RenderOptions
from localmodel.render.doorman import doorman_objects
from tests.harness.nodes import load_fixture, node_manifest

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "render"
EXAMPLES = ("qwen3", "models", "gemma-llama-server", "gemma-ollama-airgapped")
NODE_FILES = ("nodes-amx", "nodes-avx2", "nodes-small")
MACHINES = ROOT / "tests" / "fixtures" / "machines"
NOW = "2026-01-01T00:00:00Z"
# A non-default option set too, so options reach the golden objects.
OPTIONS = {
    "default": RenderOptions(),
    "custom": RenderOptions(
        operator_image="registry.example/lm/operator:9.9", pull_policy="Always",
        network_policy=True, admin_namespaces=("lm-system", "monitoring"),
    ),
}


# The idle cases: examples given `spec.idle` render as without it but for
# their pods' probes, asked every second (podspec.probe_periods;
# tests/render/test_render_golden.py holds the rest equal), plus each model's
# doorman (render/doorman.py), without and with the router and a last wake.
IDLE = {"after": "30m", "priority": 5, "release": "WhenAsleep", "holdSeconds": 60,
        "awake": [{"days": ["Mon", "Fri"], "from": "22:00", "to": "06:00",
                   "timeZone": "Europe/Berlin"}]}
IDLE_EXAMPLES = ("qwen3", "gemma-llama-server")
IDLE_NODE_SETS = ("nodes-avx2", "all-nodes")
IDLE_SUFFIX = "-idle"
ROUTER_URL = "http://localmodel-router.localmodel:80"


def with_idle(example: str) -> list[LocalModel]:
    """The example's models, each given `spec.idle` (read as the operator reads them)."""
    out = []
    for _, doc in documents(str(ROOT / "examples" / f"{example}.yaml")):
        out.append(parse_local_model({**doc, "spec": {**doc["spec"], "idle": IDLE}}))
    return out


def node_sets() -> Iterator[tuple[str, list[NodeFacts]]]:
    for name in NODE_FILES:
        yield name, parse_nodes([str(ROOT / "examples" / f"{name}.yaml")])
    yield "all-nodes", parse_nodes([str(ROOT / "examples" / f"{n}.yaml") for n in NODE_FILES])
    for fixture in ("nodes", "operator-nodes"):
        shapes = load_fixture(ROOT / "tests" / "fixtures" / f"{fixture}.yaml").nodes
        yield f"fixture-{fixture}", [from_node(node_manifest(shape)) for shape in shapes]
    for tree in sorted(p for p in MACHINES.iterdir() if p.is_dir()):
        yield f"machine-{tree.name}", [read_machine(tree).node]


def rendered(models: list[LocalModel], nodes: list[NodeFacts], options: RenderOptions
             ) -> dict[str, Any]:
    """What the renderer gives for these models on these nodes, as a golden file holds it
    (tests/conformance/golden.py renders a test-only engine's the same way)."""
    state = desired_state(models, nodes, now=NOW, options=options)
    out: dict[str, Any] = {"models": []}
    for r in state.models:
        out["models"].append(
            {
                "name": r.model.metadata.name,
                "status": r.status.model_dump(mode="json", by_alias=True, exclude_none=True),
                "pod_hashes": {str(k): v for k, v in sorted(r.pod_hashes.items())},
                "applied_hashes": {
                    f"{k}/{n}": v for (k, n), v in sorted(r.applied_hashes.items())
                },
                "objects": list(r.objects),
            }
        )
    return out


def cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file stem, what the renderer gives) for every example x node set x
    options, then the idle cases (`IDLE_EXAMPLES`, stems with `IDLE_SUFFIX`)."""
    for example in EXAMPLES:
        models = parse_models([str(ROOT / "examples" / f"{example}.yaml")])
        for nodes_name, nodes in node_sets():
            for options_name, options in OPTIONS.items():
                yield f"{example}--{nodes_name}--{options_name}", rendered(models, nodes, options)
    yield from idle_cases()


def idle_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """The idle examples' renders, each model with its doorman: without the
    router, and with it and a last wake of 14.2 s."""
    sets = dict(node_sets())
    for example in IDLE_EXAMPLES:
        models = with_idle(example)
        for nodes_name in IDLE_NODE_SETS:
            for options_name, options in OPTIONS.items():
                value = rendered(models, sets[nodes_name], options)
                value["doormen"] = {lm.metadata.name: {
                    "no router": doorman_objects(lm, options),
                    "router": doorman_objects(lm, options, router_url=ROUTER_URL,
                                              wake_seconds=14.2),
                } for lm in models}
                yield f"{example}{IDLE_SUFFIX}--{nodes_name}--{options_name}", value


def encode(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    n = 0
    for stem, value in cases():
        (OUT / f"{stem}.json").write_text(encode(value))
        n += 1
    print(f"wrote {n} golden files to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
