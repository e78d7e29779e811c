"""The engines as benchmarks/sizes.py runs them: the operator's decision for a
point (the project's rules on this machine), each engine in a memory cgroup
(tests/harness/cgroup.py) under that decision, sampled to its peak, and the
start and decode runs. Processes only through tests/harness/engines.py."""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import random
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import sizes_measure as m
from benchmarks.sizes_points import Point, decode_tensors, local_model
from localmodel.ceiling import predicted_decode
from localmodel.probe import stream
from tests.harness import engines
from tests.harness.cgroup import Cgroup, memory_cgroup

START_TIMEOUT = 900.0  # s: an 8B from a cold cache on a loaded 2-core machine
FILL_TIMEOUT = 3600.0
SAMPLE_S = 0.2
VERBOSE = {"LLAMA_ARG_LOG_VERBOSITY": "4"}  # llama.cpp's load accounting (common/arg.cpp)
FIRST_ID, LAST_ID = 1000, 150000  # ordinary tokens of both synthetic vocabularies
WORDS = ("river", "stone", "lantern", "orbit", "maple", "quartz", "harbor", "violet", "ember",
         "falcon", "meadow", "cobalt", "thunder", "willow", "copper", "glacier", "saffron")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def synth_file(shape: str) -> tuple[Path, str]:
    """The shape's GGUF and its sha256 (the script's `.sha256-ok` marker)."""
    path = engines.synthetic_model(shape)
    return path, path.with_name(path.name + ".sha256-ok").read_text().strip()


class NotPlacedError(RuntimeError):
    """The planner places the point nowhere on this machine (its decision says why)."""


def decision(p: Point, cpu: int = 1) -> dict[str, Any]:
    """What the rules decide for point `p` on this machine: args, env, Modelfile, memory."""
    from localmodel.api import parse_local_model
    from localmodel.desired import desired_state
    from localmodel.engines.ollama.pod import modelfile
    from localmodel.facts.machine import from_this_machine

    path, sha = synth_file(p.shape)
    lm = parse_local_model(local_model(p, path.stat().st_size, sha, cpu))
    result = desired_state([lm], [from_this_machine()], now="1970-01-01T00:00:00Z").models[0]
    if not result.replicas:
        placed = [c for c in result.status.conditions if c.type == "Placed"]
        raise NotPlacedError(placed[0].message if placed else str(result.status.conditions))
    t = result.replicas[0].tuning
    return {"args": list(t.args), "env": dict(t.env), "memory_bytes": t.memory_bytes,
            "parts_mib": {k: round(v / m.MiB) for k, v in t.memory_parts.items()},
            "modelfile": modelfile(lm, t) if p.engine == "ollama" else "",
            "path": path, "sha256": sha}


# ---- the page cache ----------------------------------------------------------------------

def drop_from_page_cache(path: Path) -> float:
    """Drop this file's pages from the page cache (POSIX_FADV_DONTNEED on it alone,
    never a global drop_caches); the fraction still cached after (a mapped page stays)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # a page not yet written back (a fresh import) is not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return cached_fraction(path)


def cached_fraction(path: Path) -> float:
    """The fraction of a file's pages in the page cache (mincore(2); reads nothing)."""
    page = mmap.PAGESIZE
    pages = (path.stat().st_size + page - 1) // page
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * pages)()
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                         prot=mmap.PROT_READ | mmap.PROT_WRITE) as mp:
        start = ctypes.c_char.from_buffer(mp)
        try:
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)),
                              ctypes.c_size_t(pages * page), vec)
        finally:
            del start
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"mincore {path}")
    return sum(b & 1 for b in vec) / max(1, pages)


def cold_read_mb_s(path: Path) -> float:
    """The file's sequential read speed from disk (dropped first), MB/s."""
    drop_from_page_cache(path)
    began, total = time.monotonic(), 0
    with path.open("rb", buffering=0) as f:
        while chunk := f.read(16 * m.MiB):
            total += len(chunk)
    speed = total / (time.monotonic() - began) / 1e6
    drop_from_page_cache(path)
    return round(speed, 1)


# ---- sampling a cgroup ---------------------------------------------------------------------

class Sampler:
    """Reads a cgroup's memory.stat every SAMPLE_S in a thread, keeping the peak."""

    def __init__(self, group: Cgroup) -> None:
        self.group, self.peak = group, m.Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> m.MemoryReading:
        current = "memory.current" if self.group.version == 2 else "memory.usage_in_bytes"
        charged = self.group.read(current).strip()
        return m.reading(m.parse_stat(self.group.read("memory.stat")), self.group.version,
                         int(charged) if charged.isdigit() else 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak.add(self.now())
            self._stop.wait(SAMPLE_S)

    def reset(self) -> None:
        self.peak = m.Peak()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def kills(self) -> int:
        name = "memory.events" if self.group.version == 2 else "memory.oom_control"
        return m.oom_kills(self.group.read(name), self.group.version)

    def charged_peak_mib(self) -> float:
        name = "memory.peak" if self.group.version == 2 else "memory.max_usage_in_bytes"
        raw = self.group.read(name).strip()
        return round(int(raw) / m.MiB, 1) if raw.isdigit() else 0.0


def set_limit(group: Cgroup, limit: int) -> None:
    name = "memory.max" if group.version == 2 else "memory.limit_in_bytes"
    (group.path / name).write_text(f"{limit}\n")


def loaded(sampler: Sampler, pid: int) -> dict[str, Any]:
    """The reading right after load: the cgroup's and the engine process's own."""
    r = sampler.now()
    try:
        proc = m.proc_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        proc = {}
    return {"anon_mib": round(r.anon / m.MiB, 1), "file_mib": round(r.file / m.MiB, 1),
            "file_mapped_mib": round(r.file_mapped / m.MiB, 1),
            "oom_mib": round(r.oom_relevant / m.MiB, 1),
            **{f"proc_{k}_mib": round(v / m.MiB, 1) for k, v in proc.items()}}


# ---- talking to the engines ----------------------------------------------------------------

def post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        value = json.loads(resp.read())
    return value if isinstance(value, dict) else {}


def token_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, LAST_ID) for _ in range(n)]


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def llama_fill(url: str, context: int) -> int:
    """A prompt of the slot's whole context (but room for 4 tokens), then a different
    short one (the first state then goes to the prompt cache); the prompt tokens."""
    done = post(f"{url}/completion", {"prompt": token_ids(context - 12, 1), "n_predict": 4,
                                      "ignore_eos": True}, FILL_TIMEOUT)
    post(f"{url}/completion", {"prompt": token_ids(64, 2), "n_predict": 4}, FILL_TIMEOUT)
    return int(done.get("timings", {}).get("prompt_n", 0))


def ollama_fill(url: str, model: str, context: int) -> int:
    """As `llama_fill`, in text sized from Ollama's own token count of a sample."""
    sample = post(f"{url}/api/generate", {"model": model, "prompt": words(400, 3), "raw": True,
                                          "stream": False, "options": {"num_predict": 1}},
                  FILL_TIMEOUT)
    per_word = max(0.5, int(sample.get("prompt_eval_count", 400)) / 400)
    n = int((context - 32) * 0.97 / per_word)
    done = post(f"{url}/api/generate", {"model": model, "prompt": words(n, 1), "raw": True,
                                        "stream": False, "options": {"num_predict": 4}},
                FILL_TIMEOUT)
    post(f"{url}/api/generate", {"model": model, "prompt": words(64, 2), "raw": True,
                                 "stream": False, "options": {"num_predict": 4}}, FILL_TIMEOUT)
    return int(done.get("prompt_eval_count", 0))


def decode_llama(url: str, tokens: int) -> float:
    done = post(f"{url}/completion", {"prompt": token_ids(16, 5), "n_predict": tokens,
                                      "ignore_eos": True, "cache_prompt": False}, FILL_TIMEOUT)
    return float(done["timings"]["predicted_per_second"])


def decode_ollama(url: str, model: str, tokens: int) -> float:
    done = post(f"{url}/api/generate", {"model": model, "prompt": words(12, 5), "raw": True,
                                        "stream": False, "options": {"num_predict": tokens}},
                FILL_TIMEOUT)
    return float(done["eval_count"]) / (float(done["eval_duration"]) / 1e9)


# ---- Ollama: serve, import, load -------------------------------------------------------

OLLAMA_NAME = "sizes"


def _ollama_env(d: dict[str, Any]) -> dict[str, str]:
    own = {k: v for k, v in d["env"].items() if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}
    return own | VERBOSE


@contextlib.contextmanager
def ollama_with_model(d: dict[str, Any], work: Path,
                      preexec: Callable[[], None] | None = None) -> Iterator[engines.Ollama]:
    """`ollama serve` as rendered, with the synthetic GGUF imported (`ollama create`
    from the rendered Modelfile, FROM the file), nothing loaded yet."""
    with engines.ollama_serve(work, work / "models", _ollama_env(d), preexec=preexec,
                              timeout=START_TIMEOUT) as server:
        mf = work / "Modelfile"
        mf.write_text(re.sub(r"^FROM .*$", f"FROM {d['path']}", d["modelfile"], flags=re.M))
        done = server.cli("create", OLLAMA_NAME, "-f", str(mf), timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"ollama create failed:\n{done.stdout}{done.stderr}")
        yield server


def ollama_blob(work: Path, sha256: str) -> Path:
    return work / "models" / "blobs" / f"sha256-{sha256}"


def ollama_load(server: engines.Ollama) -> float:
    """Seconds until Ollama answers a load request (no prompt) for the model."""
    began = time.monotonic()
    status, body = server.api("/api/generate", {"model": OLLAMA_NAME}, timeout=START_TIMEOUT)
    if status != 200:
        raise RuntimeError(f"loading the model answered {status}: {body}")
    return time.monotonic() - began


def ollama_unload(server: engines.Ollama) -> None:
    server.api("/api/generate", {"model": OLLAMA_NAME, "keep_alive": 0})
    end = time.monotonic() + 60
    while server.runners() and time.monotonic() < end:
        time.sleep(0.2)


# ---- the jobs ------------------------------------------------------------------------

def memory_point(p: Point, work: Path) -> dict[str, Any]:
    """One memory point under a cgroup limited to the decided memory (a point the
    planner places nowhere here is recorded with its reason)."""
    row: dict[str, Any] = {"job": "memory", "shape": p.shape, "engine": p.engine,
                           "context": p.context, "slots": p.slots, "kv": p.kv, "fa": p.fa}
    try:
        d = decision(p)
    except NotPlacedError as exc:
        return row | {"not_placed": str(exc)[:300]}
    row |= {"decided_mib": round(d["memory_bytes"] / m.MiB), "decided_parts_mib": d["parts_mib"],
            "load_before": load_average()}
    runner = _llama_memory if p.engine == "llama-server" else _ollama_memory
    with memory_cgroup(None) as group:
        row |= runner(p, d, work, group)
    return row


def _llama_memory(p: Point, d: dict[str, Any], work: Path, group: Cgroup) -> dict[str, Any]:
    set_limit(group, d["memory_bytes"])
    cached = drop_from_page_cache(d["path"])
    out: dict[str, Any] = {"cached_before": round(cached, 3)}
    with Sampler(group) as sampler:
        try:
            with engines.llama_server(work, rendered=d["args"], env=os.environ | VERBOSE,
                                      preexec=group.join, timeout=START_TIMEOUT,
                                      model=d["path"]) as server:
                out["load"] = loaded(sampler, server.process.pid)
                if p.fill:
                    out["filled_tokens"] = llama_fill(server.url, p.context)
                out["accounting"] = m.accounting(server.log_text())
        except Exception as exc:  # an OOM kill ends the engine mid-request: that is a result
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return out | {"peak": sampler.peak.row(), "oom_kills": sampler.kills(),
                  "charged_peak_mib": sampler.charged_peak_mib()}


def _ollama_memory(p: Point, d: dict[str, Any], work: Path, group: Cgroup) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Sampler(group) as sampler, ollama_with_model(d, work, group.join) as server:
        blob = ollama_blob(work, d["sha256"])
        out["cached_before"] = round(drop_from_page_cache(blob), 3)
        set_limit(group, d["memory_bytes"])
        sampler.reset()  # the import's page cache is not the pod's serving peak
        try:
            ollama_load(server)
            runner = server.runner()
            out["runner_args"] = runner.cmdline()[1:]
            out["load"] = loaded(sampler, runner.pid)
            if p.fill:
                out["filled_tokens"] = ollama_fill(server.url, OLLAMA_NAME, p.context)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        out["accounting"] = m.accounting(server.log_text())
    return out | {"peak": sampler.peak.row(), "oom_kills": sampler.kills()}


def start_and_decode(shape: str, engine: str, work: Path, runs: int, tokens: int,
                     threads: int = 1) -> dict[str, Any]:
    """Load cold and warm, then decode `runs` times at `threads` (the pod's CPUs:
    the rules render the thread count from them); with the file's cold read
    speed and the bandwidth prediction at as many threads."""
    p = Point(shape, engine, 4096, 1, "f16", "on", False)
    d = decision(p, cpu=threads)
    row: dict[str, Any] = {"job": "start", "shape": shape, "engine": engine, "threads": threads,
                           "file_mib": round(d["path"].stat().st_size / m.MiB),
                           "disk_mb_s": cold_read_mb_s(d["path"])}
    timing = _llama_start if engine == "llama-server" else _ollama_start
    row |= timing(d, work, runs, tokens)
    # The node probe's own measurement (what the operator predicts from), at the
    # pod's threads, over 512 MiB (far past any last-level cache here).
    bandwidth = stream.measure(512 * m.MiB, threads=threads).bytes_per_second
    tensors, tied = decode_tensors(shape)
    predicted = predicted_decode(bandwidth, m.bytes_per_token(tensors, tied))
    row["decode"] = {"shape": shape, "engine": engine, "threads": threads,
                     "measured": m.spread(row.pop("rates")),
                     "predicted": round(predicted.tokens_per_second, 2),
                     "predicted_source": predicted.describe,
                     "bandwidth_gb_s": round(bandwidth / 1e9, 2)}
    return row


def _llama_start(d: dict[str, Any], work: Path, runs: int, tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rates": []}
    for cache in ("cold", "warm"):
        if cache == "cold":
            out["cached_before_cold"] = round(drop_from_page_cache(d["path"]), 3)
        began = time.monotonic()
        with engines.llama_server(work / cache, rendered=d["args"], timeout=START_TIMEOUT,
                                  model=d["path"]) as server:
            out[f"{cache}_s"] = round(time.monotonic() - began, 2)
            if cache == "warm":
                out["rates"] = [decode_llama(server.url, tokens) for _ in range(runs)]
    return out


def _ollama_start(d: dict[str, Any], work: Path, runs: int, tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rates": []}
    with ollama_with_model(d, work) as server:
        blob = ollama_blob(work, d["sha256"])
        out["cached_before_cold"] = round(drop_from_page_cache(blob), 3)
        out["cold_s"] = round(ollama_load(server), 2)
        ollama_unload(server)
        out["warm_s"] = round(ollama_load(server), 2)
        out["rates"] = [decode_ollama(server.url, OLLAMA_NAME, tokens) for _ in range(runs)]
    return out
