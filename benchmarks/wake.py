"""Waking a sleeping model: the wake paths of issue 44 (docs/idle.md) side by
side, each from a request's arrival to its first token, with a warm and a cold
page cache, and what the sleeping engine still holds meanwhile.

Run: python benchmarks/wake.py [--quick] [--json] [--runs N]
Needs: the real llama-server, Ollama and the Gemma 3 270M GGUF (`bash
hack/build-engines.sh`; started and stopped by tests/harness/engines.py).
tests/realnode/test_wake_paths_on_node.py runs it in quick mode on the real
node's machine; the pod re-created (path a) is measured there, through the
operator, and printed beside these.

Paths (each engine as a pod runs it: one thread, the pod's context)
- `llama-server awake`: the floor, a request to an engine that never slept.
- `llama-server --sleep-idle-seconds`: the engine stays (the pod stays Ready:
  its /health answers while asleep) and sleeps after SLEEP_AFTER s without a
  task, freeing weights and KV; the next task reloads them. Asleep is read
  from its own `/props` `is_sleeping`.
- `ollama keep_alive 0`: `OLLAMA_KEEP_ALIVE=0` for `ollama serve` (the pod's
  setting: the gateway replaces a caller's keep_alive with the pod's), so the
  runner exits after each answer; the next request starts a runner again.
  Asleep is read from `/api/ps` (no model loaded).
- Cold: before the request the weights' file is dropped from the page cache
  with `posix_fadvise(POSIX_FADV_DONTNEED)` on that one file (the GGUF, or
  Ollama's blobs), never a global drop_caches.

Each run: wait until the engine is asleep, read the resident memory of what
stays (llama-server itself; `ollama serve` with no runner), drop the file if
cold, then stream one chat request (max 8 tokens) and time its first content
token. Columns: path, cache, median, min-max of the runs, MiB resident while
asleep (the awake row: awake), and the weights' pages in the page cache when
the request went (mincore(2): a page a sleeping process still maps cannot be
dropped, so a cold run that still shows them cached was not cold).
`--json` prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

import psutil  # noqa: E402

from localmodel.engines import llama_server as llama_facts  # noqa: E402
from localmodel.engines import ollama as ollama_facts  # noqa: E402
from tests.harness import engines  # noqa: E402
from tests.harness.engines import CHAT_TEMPLATE_ENV, MODEL_TAG  # noqa: E402
from tests.harness.processes import wait_for  # noqa: E402

SLEEP_AFTER = 1  # s: llama-server's --sleep-idle-seconds in the benchmark
CONTEXT = "1024"  # the rendered pod's context for the test model at cpu: 1
PROMPT = "Name three colours."
ASLEEP_WITHIN = 60.0  # s: generous on a shared 2-core machine
QUICK_RUNS, FULL_RUNS = 3, 5
WARM, COLD = "warm", "cold"


@dataclass
class PathResult:
    """One wake path at one cache temperature: seconds to the first token per run."""

    path: str
    cache: str
    seconds: list[float] = field(default_factory=list)
    asleep_mib: list[float] = field(default_factory=list)
    cached: list[float] = field(default_factory=list)  # the weights' pages cached at the request

    def row(self) -> dict[str, Any]:
        s = self.seconds
        return {"path": self.path, "cache": self.cache, "runs": len(s),
                "median": statistics.median(s) if s else None,
                "min": min(s) if s else None, "max": max(s) if s else None,
                "seconds": [round(x, 3) for x in s],
                "asleep_mib": round(statistics.median(self.asleep_mib), 1)
                if self.asleep_mib else None,
                "cached": round(statistics.median(self.cached), 2) if self.cached else None}


def drop_from_page_cache(paths: Iterable[Path]) -> float:
    """Drop these files' pages from the page cache (these files only:
    POSIX_FADV_DONTNEED); the fraction of their pages still cached after it
    (a page some process maps stays)."""
    paths = list(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return statistics.fmean(cached_fraction(p) for p in paths)


def cached_fraction(path: Path) -> float:
    """The fraction of a file's pages in the page cache (mincore(2) over a
    private mapping of it, which reads nothing)."""
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
            del start  # the mapping closes only without a view into it
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"mincore {path}")
    return sum(b & 1 for b in vec) / max(1, pages)


def first_token_seconds(port: int, path: str, body: dict[str, Any],
                        content_of: Callable[[dict[str, Any]], str]) -> float:
    """Stream one request to 127.0.0.1:`port`; seconds from sending it to its
    first non-empty content (SSE `data:` lines or NDJSON lines)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    began = time.monotonic()
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise AssertionError(f"{path}: {resp.status} {resp.read()[:500]!r}")
        first = None
        for raw in resp:
            line = raw.decode(errors="replace").strip().removeprefix("data:").strip()
            if not line or line == "[DONE]":
                continue
            if first is None and content_of(json.loads(line)):
                first = time.monotonic() - began
        if first is None:
            raise AssertionError(f"{path}: no token came")
        return first
    finally:
        conn.close()


def openai_content(chunk: dict[str, Any]) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])


def ollama_content(chunk: dict[str, Any]) -> str:
    return str((chunk.get("message") or {}).get("content") or "")


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 8, "temperature": 0, "stream": True}


def rss_mib(procs: Iterable[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):  # a process gone holds nothing
            total += p.memory_info().rss
    return total / 2**20


def llama_server_paths(workdir: Path, runs: int) -> list[PathResult]:
    """llama-server awake (the floor) and with --sleep-idle-seconds, warm and cold."""
    gguf = engines.require("model")
    awake = PathResult("llama-server awake", WARM)
    asleep = {c: PathResult("llama-server --sleep-idle-seconds", c) for c in (WARM, COLD)}
    args = ["-t", "1", "-c", CONTEXT, "--sleep-idle-seconds", str(SLEEP_AFTER)]
    with engines.llama_server(workdir / "llama", args, env=os.environ | CHAT_TEMPLATE_ENV) as e:
        proc = psutil.Process(e.process.pid)

        def sleeping() -> bool:
            status, props = e.api(llama_facts.PROPS_PATH, timeout=10)
            return status == 200 and isinstance(props, dict) and bool(props.get("is_sleeping"))

        first_token_seconds(e.port, "/v1/chat/completions", chat(MODEL_TAG), openai_content)
        for _ in range(runs):
            for cache in (WARM, COLD):
                wait_for("llama-server asleep", sleeping, ASLEEP_WITHIN, interval=0.2)
                asleep[cache].asleep_mib.append(rss_mib([proc]))
                asleep[cache].cached.append(drop_from_page_cache([gguf]) if cache == COLD
                                            else cached_fraction(gguf))
                asleep[cache].seconds.append(first_token_seconds(
                    e.port, "/v1/chat/completions", chat(MODEL_TAG), openai_content))
                # The floor: at once again, before it can fall asleep.
                if cache == WARM:
                    awake.asleep_mib.append(rss_mib([proc]))
                    awake.seconds.append(first_token_seconds(
                        e.port, "/v1/chat/completions", chat(MODEL_TAG), openai_content))
    return [awake, asleep[WARM], asleep[COLD]]


def ollama_paths(workdir: Path, runs: int) -> list[PathResult]:
    """`ollama serve` with OLLAMA_KEEP_ALIVE=0, warm and cold."""
    models = workdir / "ollama-models"
    modelfile = workdir / "Import.Modelfile"
    workdir.mkdir(parents=True, exist_ok=True)
    modelfile.write_text(f"FROM {engines.require('model')}\n")
    result = {c: PathResult("ollama keep_alive 0", c) for c in (WARM, COLD)}
    env = {"OLLAMA_KEEP_ALIVE": "0", "OLLAMA_NUM_PARALLEL": "1",
           "OLLAMA_CONTEXT_LENGTH": CONTEXT, **CHAT_TEMPLATE_ENV}
    with engines.ollama_serve(workdir / "ollama", models, env) as server:
        done = server.cli("create", MODEL_TAG, "-f", str(modelfile))
        assert done.returncode == 0, done.stdout + done.stderr
        blobs = [p for p in (models / "blobs").iterdir() if p.stat().st_size > 2**20]
        body = {"model": MODEL_TAG, "messages": [{"role": "user", "content": PROMPT}],
                "stream": True, "options": {"num_predict": 8, "temperature": 0,
                                            "num_thread": 1}}

        def unloaded() -> bool:
            status, ps = server.api(ollama_facts.PS_PATH, timeout=10)
            return status == 200 and not (ps.get("models") if isinstance(ps, dict) else 1) \
                and not server.runners()

        first_token_seconds(server.port, "/api/chat", body, ollama_content)
        serve = psutil.Process(server.process.pid)
        for _ in range(runs):
            for cache in (WARM, COLD):
                wait_for("ollama's runner gone", unloaded, ASLEEP_WITHIN, interval=0.2)
                result[cache].asleep_mib.append(rss_mib([serve]))
                result[cache].cached.append(drop_from_page_cache(blobs) if cache == COLD
                                            else statistics.fmean(map(cached_fraction, blobs)))
                result[cache].seconds.append(
                    first_token_seconds(server.port, "/api/chat", body, ollama_content))
    return [result[WARM], result[COLD]]


def measure(runs: int, workdir: Path | None = None) -> dict[str, Any]:
    """Every engine path, `runs` runs each; the rows and the machine's load."""
    began = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="wake-bench-") as tmp:
        work = workdir or Path(tmp)
        rows = [r.row() for r in [*llama_server_paths(work, runs), *ollama_paths(work, runs)]]
    return {"rows": rows, "runs": runs, "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.monotonic() - began, 1)}


def table(rows: list[dict[str, Any]]) -> str:
    """The paths side by side: median and spread of the first token, memory asleep."""
    out = [f"{'path':<36} {'cache':<5} {'median s':>8} {'min-max s':>13} {'asleep MiB':>10} "
           f"{'cached':>6}"]
    for r in rows:
        mem = "" if r["asleep_mib"] is None else f"{r['asleep_mib']:.0f}"
        cached = "" if r["cached"] is None else f"{r['cached']:.0%}"
        out.append(f"{r['path']:<36} {r['cache']:<5} {r['median']:>8.2f} "
                   f"{r['min']:>6.2f}-{r['max']:<6.2f} {mem:>10} {cached:>6}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per path")
    ap.add_argument("--runs", type=int, default=0, help=f"runs per path (default {FULL_RUNS})")
    ap.add_argument("--json", action="store_true", help="one JSON object as the last line")
    a = ap.parse_args()
    out = measure(a.runs or (QUICK_RUNS if a.quick else FULL_RUNS))
    print(f"cpus {out['cpus']}, load average before {out['load_before']}, "
          f"after {out['load_after']}, {out['seconds']} s")
    print(table(out["rows"]))
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
