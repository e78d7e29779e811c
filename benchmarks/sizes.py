"""Real sizes (issue 45): memory decided vs the peak that gets a pod OOM-killed,
start time from a cold and a warm page cache, and decode measured vs the
bandwidth ceiling, per synthetic real-shape model (hack/synth-gguf.py) and engine.

Run: python benchmarks/sizes.py [--quick] [--json] [--jsonl FILE] [--shapes S...]
     [--engines E...] [--jobs memory start] [--budget SECONDS] [--threads N] [--report]
Needs: root (a memory cgroup per engine), the real llama-server and Ollama and
the synthetic GGUFs (`bash hack/build-engines.sh` builds gemma3-1b; `python
hack/synth-gguf.py gemma3-4b qwen3-8b` the others); engines started and stopped
by tests/harness/engines.py.

Method
- Each point is a LocalModel with `spec.modelInfo` for the shape (its file's
  size and its GGUF's layers, KV heads and head sizes), `cpu: 1`, the point's
  context, slots, KV cache type and flash attention, evaluated by the
  project's rules (`desired.desired_state` on this machine): whatever the rules
  decide is what is measured against. llama-server runs the rendered arguments
  (but the model path, host, port); Ollama the rendered OLLAMA_* environment
  and Modelfile (FROM the synthetic GGUF, imported by `ollama create`).
- Memory: the engine runs in its own memory cgroup whose limit is the decided
  memory; the GGUF (Ollama: its blob) is dropped from the page cache first, so
  the engine's cgroup is charged for the weights it touches. `memory.stat` is
  sampled every SAMPLE_S to its OOM-relevant peak (anon + shmem + kernel:
  benchmarks/sizes_measure.py), read after load and, at the fill points,
  through a prompt that fills the slot's context (llama-server: token ids;
  Ollama: text sized from its own token count) and a second, different prompt
  (the first one's state then goes to the host-memory prompt cache). llama.cpp's
  own accounting comes from its log at LLAMA_ARG_LOG_VERBOSITY=4 (Ollama's
  llama-server child inherits it). An OOM kill is read from the cgroup.
- Start: process start to `/health` 200 (llama-server), or the load request
  answered (Ollama: `ollama serve` already up, the model imported), with the
  file dropped from the page cache (cold) and just used (warm); beside it the
  file's cold sequential read (MB/s).
- Decode: after the warm start, DECODE_RUNS completions of DECODE_TOKENS tokens
  after a 16-token prompt at the pod's threads (1); median and min-max. The
  prediction: the node probe's bandwidth measurement (localmodel.probe.stream,
  at the pod's threads) over the bytes a token reads, by the operator's own
  formula (localmodel.ceiling.predicted_decode).
Results go to a JSONL file, one line per point; a rerun skips the points it
holds (so a long run is done in bounded steps: --budget). `--json` prints one
JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from benchmarks import sizes_engines as run  # noqa: E402
from benchmarks import sizes_measure as m  # noqa: E402
from benchmarks.sizes_points import Point, grid, start_shapes  # noqa: E402

QUICK_SHAPE = "gemma3-1b"


def done_keys(path: Path) -> set[str]:
    """The keys of the points a JSONL file already holds."""
    if not path.exists():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


def jobs(args: argparse.Namespace) -> Iterator[tuple[str, Any]]:
    """(key, job) of every point this run asks for, in order: memory points, then start/decode."""
    shapes = [QUICK_SHAPE] if args.quick else args.shapes
    if "memory" in args.jobs:
        for p in grid(shapes, args.engines, args.quick):
            yield p.key, p
    if "start" in args.jobs:
        for shape, engine in start_shapes(shapes, args.engines):
            yield f"start|{shape}|{engine}|t{args.threads}", (shape, engine)


def measure(job: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    if isinstance(job, Point):
        return run.memory_point(job, work)
    shape, engine = job
    return run.start_and_decode(shape, engine, work, runs=args.runs, tokens=args.tokens,
                                threads=args.threads)


def report(all_rows: list[dict[str, Any]], quick: bool, load: str) -> dict[str, Any]:
    memory = [r for r in all_rows if r["job"] == "memory"]
    starts = [r for r in all_rows if r["job"] == "start"]
    decode = [r["decode"] for r in starts if r.get("decode")]
    return {"quick": quick, "load": load, "memory": memory, "start": starts, "decode": decode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_SHAPE}, two points (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--jsonl", type=Path, default=None, help="results, resumed (default: temp)")
    ap.add_argument("--shapes", nargs="+", default=["gemma3-1b", "gemma3-4b", "qwen3-8b"])
    ap.add_argument("--engines", nargs="+", default=["llama-server", "ollama"])
    ap.add_argument("--jobs", nargs="+", default=["memory", "start"], choices=["memory", "start"])
    ap.add_argument("--budget", type=float, default=0.0,
                    help="start no new point after this many seconds (0: no bound)")
    ap.add_argument("--runs", type=int, default=None, help="decode runs per engine")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per decode run")
    ap.add_argument("--threads", type=int, default=1,
                    help="the pod's CPUs for the start and decode jobs (threads = CPUs)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--report", action="store_true",
                    help="print the tables of --jsonl's points, measure nothing")
    a = ap.parse_args()
    a.runs = a.runs or (3 if a.quick else 5)
    a.tokens = a.tokens or (16 if a.quick else 32)
    work = a.work or Path(tempfile.mkdtemp(prefix="sizes-"))
    out = a.jsonl or work / "sizes.jsonl"
    began, have = time.monotonic(), done_keys(out)
    for key, job in jobs(a):
        if key in have or a.report:
            continue
        if a.budget and time.monotonic() - began > a.budget:
            print(f"sizes: budget of {a.budget:.0f} s spent; rerun to resume", file=sys.stderr)
            break
        print(f"sizes: {key} (load {run.load_average()})", file=sys.stderr, flush=True)
        row = {"key": key, **measure(job, work / key.replace("|", "-"), a),
               "load_after": run.load_average()}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    done = [r for r in rows(out) if r["key"] in {k for k, _ in jobs(a)}]
    result = report(done, a.quick, run.load_average())
    print(m.memory_table(result["memory"]), m.start_table(result["start"]),
          m.decode_table(result["decode"]), sep="\n\n")
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
