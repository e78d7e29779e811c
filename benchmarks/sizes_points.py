"""The points benchmarks/sizes.py measures and what the operator decides at each:
pure (the rules are evaluated on this machine's facts, read by the caller).

Which points are filled (a prompt the length of the slot's context) and why
they cover the rest: after load llama.cpp has already touched its whole KV
cache (it clears the buffer) and the repacked weights; a fill adds the pages
of the compute buffer the graph touches, the CPU backend's work buffer and,
with the second prompt, the prompt cache's copy of the state (bounded by
--cache-ram). The first two grow with the context and fall with flash
attention, so the fill points are the small shapes at the largest context a
2-core machine fills in minutes with flash attention off (the largest compute
buffer per token of context); the other points are read at load, where the
same accounting is printed by the engine.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

SYNTH = Path(__file__).resolve().parents[1] / "hack" / "synth-gguf.py"
CONTEXTS = (4096, 32768)


@dataclass(frozen=True)
class Point:
    """One memory point: a shape served by an engine as the rules render it."""

    shape: str
    engine: str
    context: int
    slots: int
    kv: str  # f16 | q8_0
    fa: str  # on | off
    fill: bool

    @property
    def key(self) -> str:
        return "|".join(["memory", self.shape, self.engine, str(self.context),
                         str(self.slots), self.kv, self.fa, "fill" if self.fill else "load"])


# (shape, context) filled, per engine; chosen by what 2 cores fill in minutes at one thread.
FILLED = {("gemma3-1b", 4096), ("gemma3-1b", 8192), ("gemma3-4b", 4096)}
QUICK = (Point("gemma3-1b", "llama-server", 4096, 1, "f16", "off", True),
         Point("gemma3-1b", "ollama", 4096, 1, "f16", "off", False))


def grid(shapes: list[str], engines: list[str], quick: bool) -> list[Point]:
    """The memory points: quick, QUICK; else per shape and engine, at load,
    contexts 4k and 32k with flash attention off and on (f16, one slot) and 32k
    with 4 slots and q8_0 KV (flash attention on: q8_0 without it is refused by
    the rules); then the filled points."""
    if quick:
        return [p for p in QUICK if p.engine in engines]
    out = []
    for shape in shapes:  # the points read at load first: a bounded run cuts fills, not shapes
        for engine in engines:
            for ctx in CONTEXTS:
                out += [Point(shape, engine, ctx, 1, "f16", fa, False) for fa in ("off", "on")]
            out.append(Point(shape, engine, 32768, 4, "q8_0", "on", False))
    for shape in shapes:
        for engine in engines:
            out += [Point(shape, engine, ctx, 1, "f16", "off", True)
                    for s, ctx in sorted(FILLED) if s == shape]
    return out


def start_shapes(shapes: list[str], engines: list[str]) -> list[tuple[str, str]]:
    """(shape, engine) of the start and decode jobs."""
    return [(s, e) for s in shapes for e in engines]


def synth() -> ModuleType:
    """hack/synth-gguf.py as a module (its name has a dash): the shapes and their plans."""
    if "synth_gguf" in sys.modules:
        return sys.modules["synth_gguf"]
    spec = importlib.util.spec_from_file_location("synth_gguf", SYNTH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["synth_gguf"] = module
    spec.loader.exec_module(module)
    return module


def model_info(shape: str, file_bytes: int) -> dict[str, Any]:
    """`spec.modelInfo` for a synthetic shape: the file's size and its GGUF's numbers."""
    from localmodel.api.spec import ModelInfo

    s = synth().SHAPES[shape]
    info = {"weightsSize": str(file_bytes), "layers": s.layers, "kvHeads": s.kv_heads,
            "keyLength": s.head_dim, "valueLength": s.head_dim, "family": s.arch,
            # The architecture fields the memory decision reads where the API has them
            # (issue 45's formula); Gemma 3 keeps one layer in six global.
            "heads": s.heads, "embeddingLength": s.embd, "feedForwardLength": s.ff,
            "vocabSize": s.vocab}
    if s.sliding_window:
        info |= {"slidingWindow": s.sliding_window, "globalLayers": s.layers // 6}
    known = {_camel(name) for name in ModelInfo.model_fields}
    return {k: v for k, v in info.items() if k in known}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def local_model(p: Point, file_bytes: int, sha256: str, cpu: int = 1) -> dict[str, Any]:
    """The LocalModel of point `p` (its GGUF named by URL and sha256: the pod's source)."""
    return {
        "apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
        "metadata": {"name": "sizes", "namespace": "bench"},
        "spec": {
            "model": f"synth-{p.shape}", "cpu": cpu, "context": p.context, "slots": p.slots,
            "kvCache": p.kv, "flashAttention": "enabled" if p.fa == "on" else "disabled",
            "engine": {"name": p.engine},
            "gguf": {"url": f"https://models.invalid/{p.shape}.gguf", "sha256": sha256},
            "modelInfo": model_info(p.shape, file_bytes),
        },
    }


def decode_tensors(shape: str) -> tuple[list[tuple[str, int]], bool]:
    """(name, bytes) of the shape's tensors and whether its embeddings are tied."""
    mod = synth()
    s = mod.SHAPES[shape]
    return [(t.name, mod.nbytes(t)) for t in mod.plan(s)], bool(s.tied)
