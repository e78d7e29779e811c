"""The measures benchmarks/sizes.py takes (issue 45), as pure functions over
what the kernel and the engines print, plus the few readers that get it.

- Memory that gets a pod OOM-killed (docs/engine-facts.md#the-memory-that-gets-a-pod-oom-killed):
  a container's cgroup is charged for anonymous memory, for the page cache its
  processes first touched (mapped or read) and for kernel memory; at its limit
  the kernel reclaims what it can (clean file pages, mapped ones included) and
  kills when that is not enough. So the OOM-relevant part is what reclaim
  cannot free without swap: anon + shmem + unreclaimable kernel memory
  (`oom_relevant`); the file pages (llama-server's mapped weights) are charged
  too but reclaimable: under a limit below them the engine re-reads its weights
  from disk instead of dying. Read from the cgroup's `memory.stat` (v2:
  `anon`, `shmem`, `file`, `file_mapped`, the kernel lines; v1: `rss`, `shmem`,
  `cache`, `mapped_file`), sampled to its peak (no kernel keeps an anon peak),
  beside `memory.peak` (v1 `memory.max_usage_in_bytes`: page cache included).
- llama.cpp's own load accounting (`LLAMA_ARG_LOG_VERBOSITY=4`): model buffers
  (mapped, repacked, read into memory), KV cache, compute and output buffers.
- A stream-style copy bandwidth (arrays far beyond the last-level cache) and
  the decode rate it predicts: bytes read per token over bandwidth.
- Medians with their spread, and the table the benchmark prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.verdict import Spread

MiB = 2**20
# v2 memory.stat lines of kernel memory that reclaim cannot free (cgroup-v2.rst, memory.stat).
V2_KERNEL = ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock",
             "slab_unreclaimable")


def parse_stat(text: str) -> dict[str, int]:
    """`memory.stat` (either version): `name value` lines -> {name: value}; a line
    that is not two fields with an integer second is ignored (bounded: 256 lines)."""
    out: dict[str, int] = {}
    for line in text.splitlines()[:256]:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class MemoryReading:
    """One reading of a cgroup's memory, in bytes, named the same for v1 and v2."""

    anon: int  # anonymous memory (v1 `rss`)
    shmem: int  # swap-backed page cache (tmpfs, shared anonymous mappings)
    file: int  # page cache charged here (v1 `cache`), shmem included
    file_mapped: int  # of which mapped into a process (v1 `mapped_file`)
    kernel: int  # unreclaimable kernel memory (v2 only; v1 keeps it in memory.kmem.*)
    charged: int = 0  # memory.current (v1 usage_in_bytes): all of the above and more

    @property
    def oom_relevant(self) -> int:
        """What reclaim cannot free: what the limit must hold not to OOM-kill."""
        return self.anon + self.shmem + self.kernel


def reading(stat: Mapping[str, int], version: int, charged: int = 0) -> MemoryReading:
    """A `MemoryReading` from a parsed memory.stat of cgroup `version` (1 or 2)."""
    if version == 2:
        return MemoryReading(stat.get("anon", 0), stat.get("shmem", 0), stat.get("file", 0),
                             stat.get("file_mapped", 0), sum(stat.get(k, 0) for k in V2_KERNEL),
                             charged)
    return MemoryReading(stat.get("rss", 0), stat.get("shmem", 0), stat.get("cache", 0),
                         stat.get("mapped_file", 0), 0, charged)


@dataclass
class Peak:
    """The largest of each field over readings, and the reading at the largest
    OOM-relevant total (the fields' maxima need not come at one instant)."""

    samples: int = 0
    at_peak: MemoryReading | None = None
    most: dict[str, int] = field(default_factory=dict)

    def add(self, r: MemoryReading) -> None:
        self.samples += 1
        if self.at_peak is None or r.oom_relevant > self.at_peak.oom_relevant:
            self.at_peak = r
        for k, v in asdict(r).items():
            self.most[k] = max(self.most.get(k, 0), v)

    def row(self) -> dict[str, Any]:
        """MiB: the OOM-relevant peak and each field's own peak."""
        top = self.at_peak.oom_relevant if self.at_peak else 0
        return {"peak_oom_mib": round(top / MiB, 1), "samples": self.samples,
                **{f"peak_{k}_mib": round(v / MiB, 1) for k, v in self.most.items()}}


def oom_kills(events: str, version: int) -> int:
    """OOM kills in the cgroup: v2 `memory.events` `oom_kill`, v1 `memory.oom_control`'s."""
    del version  # both files spell it `oom_kill N`
    return parse_stat(events).get("oom_kill", 0)


def proc_status(text: str) -> dict[str, int]:
    """/proc/PID/status memory lines in bytes: RssAnon, RssFile, RssShmem, VmHWM, VmRSS."""
    out = {}
    for line in text.splitlines()[:128]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("RssAnon", "RssFile", "RssShmem", "VmHWM", "VmRSS") and parts \
                and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


# ---- llama.cpp's load accounting ------------------------------------------------------

_BUFFER = re.compile(r"\b(CPU(?:_Mapped|_REPACK)?)\s+(model|compute|output) buffer size\s*=\s*"
                     r"([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")
_CONTEXT = re.compile(r"llama_context: n_ctx\s*=")


def accounting(log: str) -> dict[str, float]:
    """MiB llama.cpp reports for the last model load in `log` (level 4): `mapped`
    (weights left in the mapped file), `repack` (weights copied into anonymous
    memory for the CPU's kernels), `read` (weights read into memory: no mmap),
    `kv` (every cache's, summed), `compute`, `output`. A kind not printed is absent."""
    contexts = [c.start() for c in _CONTEXT.finditer(log)] or [0]
    start, before = contexts[-1], (contexts[-2] if len(contexts) > 1 else 0)
    out: dict[str, float] = {}
    names = {("CPU_Mapped", "model"): "mapped", ("CPU_REPACK", "model"): "repack",
             ("CPU", "model"): "read", ("CPU", "compute"): "compute",
             ("CPU", "output"): "output"}
    for m in _BUFFER.finditer(log, before):  # this load's model buffers precede its context
        name = names.get((m.group(1), m.group(2)))
        if name and (m.start() >= start or m.group(2) == "model"):
            out[name] = float(m.group(3))
    kv = [float(m.group(1)) for m in _KV.finditer(log, start)]
    if kv:
        out["kv"] = round(sum(kv), 2)
    return out


# ---- bandwidth and the decode rate it predicts ----------------------------------------

def bytes_per_token(tensors: Iterable[tuple[str, int]], tied: bool,
                    kv_bytes_read: int = 0) -> int:
    """Bytes one decoded token reads: every weight once, but the token embedding's
    one row when an output matrix of its own is there (untied: a row lookup),
    plus the KV cache read at the current depth."""
    total = 0
    for name, size in tensors:
        if name == "token_embd.weight" and not tied:
            continue
        total += size
    return total + kv_bytes_read


# ---- summaries and the table -----------------------------------------------------------

def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, min and max of repeated points (benchmarks/verdict.py's Spread;
    None when there are none)."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    s = Spread.of(values)
    return {"n": s.n, "median": round(s.median, 3), "min": round(s.low, 3),
            "max": round(s.high, 3)}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return round(a / b, 2) if a is not None and b else None


def _cell(v: Any, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v) if isinstance(v, int | float) else str(v)


def resident_need_mib(r: Mapping[str, Any]) -> float | None:
    """What must stay resident at a point's peak: the OOM-relevant peak (anon + shmem +
    unreclaimable kernel memory) plus llama-server's mapped weights its repack did not
    copy (file pages, reclaimable, but read every token: evicted, the engine re-reads
    them from disk each token). Ollama's child reads its weights into anonymous memory."""
    peak = (r.get("peak") or {}).get("peak_oom_mib")
    if peak is None:
        return None
    a = r.get("accounting") or {}
    mapped = max(0.0, a.get("mapped", 0.0) - a.get("repack", 0.0))
    return float(peak) + (mapped if r.get("engine") == "llama-server" else 0.0)


def memory_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The memory points: decided vs what must stay resident (`resident_need_mib`) at
    the peak, measured through a prompt that fills the context ("filled tokens") or
    only after load (where the compute buffer's pages, the work buffer, the context
    checkpoints and the prompt cache are not touched yet: llama.cpp's own accounting
    beside it says what the load allocated)."""
    head = ("| shape | engine | ctx | slots | KV | FA | filled tokens | decided MiB | "
            "acct KV+compute+repack MiB | anon at load MiB | peak OOM-relevant MiB | "
            "mapped not repacked MiB | decided/(peak+mapped) | OOM kills |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        a = r.get("accounting") or {}
        acct = sum(a.get(k, 0.0) for k in ("kv", "compute", "repack", "read", "output"))
        need = resident_need_mib(r)
        peak = r.get("peak", {}).get("peak_oom_mib")
        lines.append("| " + " | ".join([
            r["shape"], r["engine"], str(r["context"]), str(r["slots"]), r["kv"], r["fa"],
            _cell(r.get("filled_tokens")), _cell(r.get("decided_mib")),
            _cell(acct or None), _cell(r.get("load", {}).get("anon_mib")),
            _cell(peak), _cell(None if need is None or peak is None else need - peak),
            _cell(ratio(r.get("decided_mib"), need), "{:.2f}"),
            _outcome(r)]) + " |")
    return "\n".join(lines)


def _outcome(r: Mapping[str, Any]) -> str:
    """The OOM kills, or why the point has no reading."""
    if "not_placed" in r:
        return "not placed: " + str(r["not_placed"]).split(": ")[-1][:80]
    if "error" in r:
        return f"{_cell(r.get('oom_kills'))} (error: {str(r['error'])[:80]})"
    return _cell(r.get("oom_kills"))


def start_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Load times, cold and warm page cache, with the file's cold read speed."""
    lines = ["| shape | engine | file MiB | cold read MB/s | load cold s | load warm s | "
             "cached before cold start |", "|" + "---|" * 7]
    for r in rows:
        lines.append("| " + " | ".join([
            r["shape"], r["engine"], _cell(r.get("file_mib")), _cell(r.get("disk_mb_s")),
            _cell(r.get("cold_s"), "{:.1f}"), _cell(r.get("warm_s"), "{:.1f}"),
            _cell(r.get("cached_before_cold"), "{:.2f}")]) + " |")
    return "\n".join(lines)


def decode_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Decode measured (median, min-max) against the bandwidth ceiling predicted."""
    lines = ["| shape | engine | threads | measured tok/s (median) | min-max | runs | "
             "predicted tok/s | measured/predicted | bandwidth GB/s |", "|" + "---|" * 9]
    for r in rows:
        m = r.get("measured") or {}
        lines.append("| " + " | ".join([
            r["shape"], r["engine"], str(r["threads"]), _cell(m.get("median"), "{:.2f}"),
            f"{_cell(m.get('min'), '{:.2f}')}-{_cell(m.get('max'), '{:.2f}')}",
            _cell(m.get("n")), _cell(r.get("predicted"), "{:.2f}"),
            _cell(ratio(m.get("median"), r.get("predicted")), "{:.2f}"),
            _cell(r.get("bandwidth_gb_s"), "{:.1f}")]) + " |")
    return "\n".join(lines)
