"""A model's start at real sizes: how long each engine takes to load a model
from a cold page cache and a warm one, with the file's own cold read speed
beside it, against the operator's expected load (`podspec.expected_load_seconds`),
which the startup probe's bound and doctor's expectation are derived from.

Run, one step at a time (each appends its records to --out, so a long
measurement is split into steps; run each under the machine's engine lock):
    python benchmarks/start.py --shapes gemma3-1b --engines llama-server --runs 3
    python benchmarks/start.py --report            # the table and the fit, from --out
    python benchmarks/start.py --quick             # CI: the test model, one run, both engines
Needs: the real llama-server and Ollama (`bash hack/build-engines.sh`, started
and stopped by tests/harness/engines.py), the synthetic real-shape GGUFs
(`python hack/synth-gguf.py SHAPE`) and the Gemma 3 270M test model.

Method
- Shapes: the 270M test model and the synthetic shapes (hack/synth-gguf.py:
  real architectures' tensors, Q4_K_M), each a GGUF file on this machine's disk.
- `read`: the file dropped from the page cache (POSIX_FADV_DONTNEED on that
  file only, never a global drop), then read once from start to end in 16 MiB
  reads: the disk's cold sequential read speed for it.
- llama-server: started as a pod runs it (one thread, `-c 4096 -np 1`, no web
  UI) on the file; seconds from the process's start to `/health` answering
  200 (polled every 50 ms). Ollama: one `ollama serve` per shape with the
  pod's environment and its own store, the model created from a Modelfile
  `FROM` the file (the file linked in as the blob of its digest, as the
  operator's download step places it: nothing copied) with the pod's
  parameters (num_thread 1, num_ctx 4096); seconds of the gateway's load
  request (a generate without a prompt) until it answers; then unloaded
  (keep_alive 0) until its llama-server child is gone.
- `cold`: the file dropped from the page cache just before the start (its
  cached share after the drop recorded); `warm`: the file read through just
  before. Cold and warm alternate within each run.
- `--report`: per shape and engine the median and range of each, the read
  speed, the operator's expected load (its default disk speed, and the
  measured one); per engine the least-squares line of warm seconds over the
  file's GiB: the intercept is the engine's fixed cost, the slope its work per
  GiB (EngineFacts.LOAD_FIXED_SECONDS, LOAD_SECONDS_PER_GIB).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from localmodel.engines import llama_server as llama_facts  # noqa: E402
from localmodel.podspec import expected_load_seconds  # noqa: E402
from tests.harness import engines  # noqa: E402

LLAMA, OLLAMA = "llama-server", "ollama"
COLD, WARM = "cold", "warm"
TEST_MODEL = "gemma3-270m"
SYNTH = ("gemma3-1b", "gemma3-4b", "qwen3-8b")
CONTEXT = 4096
LOAD_TIMEOUT = 900.0
CHUNK = 16 * 1024 * 1024
GIB = 1024**3
OUT = ROOT / "docs" / "drafts" / "start-load.jsonl"


def shape_paths(shapes: list[str]) -> dict[str, Path]:
    """Each shape's GGUF: the test model from the build, the synthetic ones
    from hack/synth-gguf.py --print (which writes nothing)."""
    out: dict[str, Path] = {}
    synth = [s for s in shapes if s != TEST_MODEL]
    if TEST_MODEL in shapes:
        out[TEST_MODEL] = engines.require("model")
    if synth:
        text = subprocess.run([sys.executable, str(ROOT / "hack" / "synth-gguf.py"), "--print",
                               *synth], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            name, _, path = line.partition("=")
            out[name] = Path(path)
    for name, path in out.items():
        if not path.is_file():
            raise SystemExit(f"{name}: {path} missing (python hack/synth-gguf.py {name})")
    return out


def drop_from_page_cache(path: Path) -> float:
    """Drop one file's pages from the page cache (that file only); the share
    of its pages still cached after it (a page a process maps stays)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # a dirty page (a fresh copy's) is not dropped until written
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return cached_fraction(path)


def cached_fraction(path: Path) -> float:
    """The share of a file's pages in the page cache (mincore(2) over a
    private mapping, which reads nothing)."""
    page = mmap.PAGESIZE
    pages = (path.stat().st_size + page - 1) // page
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * pages)()
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                         prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
        start = ctypes.c_char.from_buffer(m)
        try:
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)),
                              ctypes.c_size_t(pages * page), vec)
        finally:
            del start
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"mincore {path}")
    return sum(b & 1 for b in vec) / max(1, pages)


def read_through(path: Path) -> float:
    """Read the whole file once; seconds."""
    began = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, CHUNK):
            pass
    finally:
        os.close(fd)
    return time.monotonic() - began


def prepare(path: Path, cache: str) -> float:
    """The file cold (dropped) or warm (read through); its cached share."""
    if cache == COLD:
        return drop_from_page_cache(path)
    read_through(path)
    return cached_fraction(path)


def measure_read(path: Path) -> dict[str, Any]:
    left = drop_from_page_cache(path)
    seconds = read_through(path)
    size = path.stat().st_size
    return {"kind": "read", "cached_before": round(left, 4), "seconds": round(seconds, 3),
            "mb_per_s": round(size / seconds / 1e6, 1)}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def llama_load(work: Path, path: Path, cache: str) -> dict[str, Any]:
    """One llama-server start on the file; seconds to /health 200."""
    cached = prepare(path, cache)
    args = ["-m", str(path), "-t", "1", "-tb", "1", "-c", str(CONTEXT), "-np", "1",
            "--no-webui"]
    began = time.monotonic()
    server = engines.start_llama_server(work, args)
    try:
        while not _http_ok(server.url + llama_facts.HEALTH_PATH):
            if time.monotonic() - began > LOAD_TIMEOUT or not server.process.running:
                raise RuntimeError(f"llama-server did not load {path}:\n"
                                   + server.log_text()[-2000:])
            time.sleep(0.05)
        seconds = time.monotonic() - began
    finally:
        server.stop()
    return {"kind": LLAMA, "cache": cache, "cached_before": round(cached, 4),
            "seconds": round(seconds, 3)}


def _sha256_of(path: Path) -> str:
    """The file's digest, from synth-gguf's checked marker beside it, else computed."""
    marker = path.with_name(path.name + ".sha256-ok")
    if marker.is_file():
        return marker.read_text().split()[0]
    out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def ollama_server(work: Path, path: Path) -> tuple[engines.Ollama, float]:
    """`ollama serve` as the pod runs it, its store holding the file as a blob
    (a link: nothing copied) and the model created from it; the serve's start."""
    models = work / "models"
    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = _sha256_of(path)
    os.symlink(path, blobs / f"sha256-{digest}")
    env = {"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": str(CONTEXT),
           "OLLAMA_MAX_LOADED_MODELS": "1", "OLLAMA_KEEP_ALIVE": "-1", "GOMAXPROCS": "1",
           "OLLAMA_NOPRUNE": "1"}
    began = time.monotonic()
    server = engines.start_ollama(work, models, env)
    serve_seconds = time.monotonic() - began
    modelfile = work / "Modelfile"
    modelfile.write_text(f"FROM {blobs / f'sha256-{digest}'}\nPARAMETER num_thread 1\n"
                         f"PARAMETER num_ctx {CONTEXT}\n")
    done = server.cli("create", "start-bench", "-f", str(modelfile), timeout=LOAD_TIMEOUT)
    if done.returncode != 0:
        server.stop()
        raise RuntimeError(f"ollama create: {done.stdout[-1000:]} {done.stderr[-1000:]}")
    return server, serve_seconds


def ollama_load(server: engines.Ollama, path: Path, cache: str) -> dict[str, Any]:
    """One load of the created model (the gateway's load request), then unloaded."""
    cached = prepare(path, cache)
    body = {"model": "start-bench", "keep_alive": -1, "stream": False,
            "options": {"num_thread": 1, "num_ctx": CONTEXT}}
    began = time.monotonic()
    status, answer = server.api("/api/generate", body, timeout=LOAD_TIMEOUT)
    seconds = time.monotonic() - began
    if status != 200:
        raise RuntimeError(f"ollama load: {status} {str(answer)[:500]}")
    server.api("/api/generate", {"model": "start-bench", "keep_alive": 0, "stream": False})
    end = time.monotonic() + 120
    while server.runners():
        if time.monotonic() > end:
            raise RuntimeError("the llama-server child did not exit after keep_alive 0")
        time.sleep(0.1)
    load_ns = answer.get("load_duration") if isinstance(answer, dict) else None
    return {"kind": OLLAMA, "cache": cache, "cached_before": round(cached, 4),
            "seconds": round(seconds, 3),
            "ollama_load_seconds": round(load_ns / 1e9, 3) if load_ns else None}


def runs_of(engine: str, work: Path, path: Path, runs: int) -> Iterator[dict[str, Any]]:
    """`runs` rounds of cold then warm for one engine on one file."""
    if engine == LLAMA:
        for _ in range(runs):
            for cache in (COLD, WARM):
                yield llama_load(work, path, cache)
        return
    server, serve_seconds = ollama_server(work, path)
    try:
        yield {"kind": "ollama-serve", "seconds": round(serve_seconds, 3)}
        for _ in range(runs):
            for cache in (COLD, WARM):
                yield ollama_load(server, path, cache)
    finally:
        server.stop()


def measure(args: argparse.Namespace, paths: dict[str, Path] | None = None) -> None:
    paths = paths or shape_paths(args.shapes)
    with args.out.open("a") as out:
        def write(shape: str, record: dict[str, Any]) -> None:
            size = paths[shape].stat().st_size
            full = {"shape": shape, "bytes": size, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime()),
                    "load_avg": round(os.getloadavg()[0], 2), **record}
            out.write(json.dumps(full) + "\n")
            out.flush()
            print(json.dumps(full), flush=True)
        for shape, path in paths.items():
            if args.read:
                write(shape, measure_read(path))
            for engine in args.engines:
                with tempfile.TemporaryDirectory(prefix="start-bench-") as tmp:
                    for record in runs_of(engine, Path(tmp), path, args.runs):
                        write(shape, record)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares `seconds = a + b x GiB` over (GiB, seconds): (a, b)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def _cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f}, {len(xs)})"


def report(records: list[dict[str, Any]], show: Callable[[str], None] = print) -> dict[str, Any]:
    """The table per shape and engine, and per engine the warm fit."""
    shapes = sorted({r["shape"] for r in records}, key=lambda s: min(
        r["bytes"] for r in records if r["shape"] == s))
    show("| shape | GiB | cold read MB/s | engine | cold s | warm s | expected s (50 MB/s) "
         "| expected s (measured read) |")
    show("|---|---|---|---|---|---|---|---|")
    warm_points: dict[str, list[tuple[float, float]]] = {}
    for shape in shapes:
        mine = [r for r in records if r["shape"] == shape]
        size = mine[0]["bytes"]
        reads = [r["mb_per_s"] for r in mine if r["kind"] == "read"]
        read = _median(reads)
        for engine in (LLAMA, OLLAMA):
            of = [r for r in mine if r["kind"] == engine]
            if not of:
                continue
            cold = [r["seconds"] for r in of if r["cache"] == COLD]
            warm = [r["seconds"] for r in of if r["cache"] == WARM]
            warm_points.setdefault(engine, []).extend((size / GIB, w) for w in warm)
            measured = (f"{expected_load_seconds(size, engine, read * 1e6):.1f}"
                        if read else "-")
            show(f"| {shape} | {size / GIB:.2f} | {_cell(reads)} | {engine} | {_cell(cold)} "
                 f"| {_cell(warm)} | {expected_load_seconds(size, engine):.1f} | {measured} |")
    fits = {}
    for engine, points in warm_points.items():
        if len({p[0] for p in points}) >= 2:
            a, b = fit(points)
            fits[engine] = {"fixed_seconds": round(a, 2), "seconds_per_gib": round(b, 2)}
            show(f"{engine}: warm load = {a:.2f} s + {b:.2f} s/GiB ({len(points)} points)")
    return fits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=[TEST_MODEL, *SYNTH])
    p.add_argument("--engines", nargs="+", default=[LLAMA, OLLAMA], choices=[LLAMA, OLLAMA])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-read", dest="read", action="store_false",
                   help="skip the file's cold read")
    p.add_argument("--out", type=Path, default=OUT, help="the JSONL file records append to")
    p.add_argument("--report", action="store_true", help="print the table from --out only")
    p.add_argument("--quick", action="store_true",
                   help="the test model only, one run, on a copy of it (so the drop touches "
                        "no file another process reads), the report after it")
    args = p.parse_args(argv)
    if args.quick:
        return quick(args)
    if not args.report:
        measure(args)
        return 0
    records = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    print(json.dumps(report(records)))
    return 0


def quick(args: argparse.Namespace) -> int:
    """CI's run: the test model, copied, one cold and one warm load per engine."""
    with tempfile.TemporaryDirectory(prefix="start-quick-") as tmp:
        copy = Path(tmp) / "model.gguf"
        shutil.copyfile(engines.require("model"), copy)
        args.shapes, args.runs = [TEST_MODEL], 1
        args.out = Path(tmp) / "start.jsonl"
        measure(args, {TEST_MODEL: copy})
        records = [json.loads(line) for line in args.out.read_text().splitlines()]
    print(json.dumps({"quick": True, "records": records, "fits": report(records)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
