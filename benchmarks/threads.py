"""What the thread rule buys: a real engine and the real model under a pod-like
CPU budget, at the thread count the operator's rules choose versus the engine's
own default and oversubscribed counts, side by side.

Run: python benchmarks/threads.py [--quick] [--json] [--budgets 1 2] [--reps N] [--rounds R]
Needs: root (to create a cgroup), llama.cpp's llama-server and the Gemma 3 270M
GGUF (`bash hack/build-engines.sh llama model`; found, started and stopped by
tests/harness/engines.py), optionally the real Ollama (`bash
hack/build-engines.sh ollama`); the Ollama columns say why they are missing
without it.

Method
- The budget is a cgroup CPU quota, like a pod's CPU limit: cgroup v1
  `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or cgroup v2 `cpu.max`, whichever
  hierarchy carries the cpu controller here (the kubelet writes quota =
  milliCPU x 100000 / 1000 per 100 ms period). Without either, a cpuset
  (`sched_setaffinity`) stands in, and the output says so. The engine runs
  inside that cgroup and nothing else does.
- The operator's thread count is not a constant: a child process started in
  the same cgroup reads this machine's facts (`facts/machine.py`: CPU count,
  cpuset, cgroup quota), plans a `cpu: node` LocalModel onto it and evaluates
  the project's rules (`desired.desired_state`), exactly as `localmodel
  render` does on this machine. The decisions that fired are printed.
- The engine's default is the engine started without any thread flag; the
  count it chose is read from its log.
- Points: operator, engine default, 2x / 4x / 8x the budget, and a sweep from
  1 to 2x the budget. Every point is a fresh llama-server (`-t N -tb N -np 1
  --no-warmup`), the same model and context.
- Prefill: a prompt of about PROMPT tokens (a unique first word per request,
  `cache_prompt: false`), one token generated; tok/s is the engine's own
  `timings.prompt_per_second`. The first request at each point is a warm-up
  and is not counted.
- Decode: a streamed completion of DECODE tokens (`ignore_eos`, greedy);
  tok/s = tokens after the first / time from the first token to the last, on
  the client's clock. At oversubscribed counts a token can take many seconds:
  a decode stops at a time cap and then counts the tokens seen in the window
  (marked `<` in the table when fewer than two arrived: an upper bound).
- Repeats, interleaved (benchmarks/verdict.py): first the weights file is
  read once (the page cache) and the operator's point runs once uncounted
  (the warm-up), then every point once per round for `--rounds` rounds, in
  the same order each round (A B C A B C ...), each time a fresh engine. A
  round's number is the median of `--reps` requests; a point's number the
  median of its rounds, and its spread their lowest and highest. A point
  whose decode collapsed (cut at the cap) is not measured again. A point with
  the operator's thread count is the operator's command: it is not measured
  apart (nor compared).
- Verdict: the operator's median decode over the best median of the points
  whose thread count differs from the operator's: ">= 0.95", "inside the
  spread" (below 0.95 but the two points' rounds overlap) or "below".
- The machine is shared: the 1-, 5- and 15-minute load averages are printed
  before and after each budget, with the cgroup's throttling counters.
- On an SMT machine (more logical CPUs than physical cores) a last group runs
  without a quota at one thread per physical core and one per logical CPU:
  what the SMT question in docs/doctor.md needs measured on such a node.

Columns: prefill and decode tok/s per point, and the ratios operator /
best-of-sweep and operator / point. `--json` prints one JSON object as the last
line (operator_vs_best_decode, operator_vs_default_decode, ... per budget and
overall for the first budget).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from benchmarks.verdict import Measured, Spread, Verdict, interleaved, verdict  # noqa: E402
from tests.harness import engines  # noqa: E402
from tests.harness.cgroup import (  # noqa: E402
    PERIOD_US,
    Cgroup,
    CgroupUnavailableError,
    cpu_quota_cgroup,
)
from tests.harness.engines import MODEL_TAG, EngineMissingError  # noqa: E402

# The GGUF's checksum (hack/build-engines.sh); the spec needs one, nothing downloads.
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
CONTEXT = 2048

TEXT = (
    "the operator reads each node's CPU budget and renders pods whose engine settings "
    "are right for that node so that decode does not collapse under a quota"
)


# --- the CPU budget ------------------------------------------------------------


class CpuBudget:
    """A CPU-quota cgroup of `cpus` CPUs (tests/harness/cgroup.py: v2 `cpu.max`
    where the machine has the v2 cpu controller, else v1 `cpu.cfs_quota_us`),
    else a cpuset (`sched_setaffinity`), saying which."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self._stack = contextlib.ExitStack()
        self._affinity = True  # without a cgroup, a cpuset stands in
        self.group: Cgroup | None = None
        try:
            self.group = self._stack.enter_context(cpu_quota_cgroup(cpus=cpus))
        except CgroupUnavailableError as exc:
            self.kind = f"cpuset (sched_setaffinity) CPUs 0-{cpus - 1}: no CPU quota here ({exc})"
            return
        quota = cpus * PERIOD_US
        # Weight well above the default: within its quota the budget gets its
        # CPU first, as a Guaranteed pod's exclusive CPUs would; the quota still
        # caps it, so everyone else keeps the rest of the machine.
        weight = "cpu.weight" if self.group.version == 2 else "cpu.shares"
        with contextlib.suppress(OSError):
            (self.group.path / weight).write_text("10000" if self.group.version == 2 else "10240")
        if self.group.version == 2:
            self.kind = f"cgroup v2 {self.group.path}: cpu.max '{quota} {PERIOD_US}'"
        else:
            self.kind = (
                f"cgroup v1 {self.group.path}: cpu.cfs_quota_us={quota} "
                f"cpu.cfs_period_us={PERIOD_US}"
            )

    @classmethod
    def unlimited(cls) -> CpuBudget:
        """No budget: the whole machine."""
        budget = cls.__new__(cls)
        budget.cpus, budget.group, budget._stack = os.cpu_count() or 1, None, contextlib.ExitStack()
        budget.kind = "no quota"
        budget._affinity = False
        return budget

    def enter(self) -> Callable[[], None]:
        """A preexec_fn that moves the child into the budget before it execs."""
        if self.group is not None:
            return self.group.join
        if not self._affinity:
            return lambda: None
        cpus = self.cpus
        return lambda: os.sched_setaffinity(0, set(range(cpus)))

    def throttling(self) -> dict[str, int]:
        """cpu.stat counters: periods, throttled periods, throttled time."""
        if self.group is None:
            return {}
        out = {}
        for line in (self.group.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("nr_periods", "nr_throttled", "throttled_time", "throttled_usec"):
                out[key] = int(value)
        return out

    def close(self) -> None:
        self._stack.close()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- the operator's choice, computed inside the budget --------------------------


def operator_choice_here(engine: str) -> dict[str, Any]:
    """What the project's rules decide for a `cpu: node` model on this machine, now."""
    from localmodel.api import parse_local_model
    from localmodel.desired import desired_state
    from localmodel.engines.ollama.pod import modelfile
    from localmodel.facts.machine import from_this_machine

    node = from_this_machine()
    lm = parse_local_model(
        {
            "apiVersion": "localmodel.dev/v1alpha1",
            "kind": "LocalModel",
            "metadata": {"name": "bench"},
            "spec": {
                "model": MODEL_TAG,
                "cpu": "node",
                "context": CONTEXT,
                "engine": {"name": engine},
                # The budget here is the engine container's; no sidecar shares it.
                "gateway": {"enabled": False},
            }
            | (
                {"gguf": {"url": "https://models.invalid/m.gguf", "sha256": GGUF_SHA256}}
                if engine == "llama-server"
                else {}
            ),
        }
    )
    result = desired_state([lm], [node], now="1970-01-01T00:00:00Z").models[0]
    if not result.replicas:
        raise SystemExit(f"the planner placed nothing here: {result.status.conditions}")
    replica = result.replicas[0]
    tuning = replica.tuning
    pod = next(o for o in result.objects if o["kind"] == "Pod")
    engine_container = pod["spec"]["containers"][0]
    args: list[str] = engine_container.get("args", [])
    if engine == "llama-server":  # what the pod really runs with
        threads = int(args[args.index("-t") + 1])
    else:
        threads = int(tuning.modelfile["num_thread"])
    return {
        "threads": threads,
        "node": {
            "allocatable_cpu_milli": node.allocatable_cpu_milli,
            "cpuset_cpus": node.cpuset_cpus,
            "cgroup_cpu_quota": node.cgroup_cpu_quota,
        },
        "decisions": [f"{d.rule}: {d.effect}" for d in tuning.decisions],
        "env": tuning.env,
        "modelfile": modelfile(lm, tuning),
        "args": args,
    }


def operator_choice(budget: CpuBudget, engine: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--operator-choice", engine],
        capture_output=True,
        text=True,
        preexec_fn=budget.enter(),
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"computing the operator's choice failed:\n{out.stderr}")
    choice: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return choice


# --- talking to an engine ---------------------------------------------------------


def prompt(n_words: int, tag: int) -> str:
    text = TEXT.split(" ")
    words = [f"w{tag}"] + [text[i % len(text)] for i in range(n_words - 1)]
    return " ".join(words)


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


@dataclass
class Decode:
    """Token arrivals of one streamed completion."""

    tokens: int  # tokens seen, the first included
    seconds: float  # first token to the last, or to the cut-off
    cut: bool  # stopped at the time cap

    @property
    def rate(self) -> float:
        """tok/s; when cut, the upper bound tokens / window (the next token was later)."""
        if self.cut:
            return self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (self.tokens - 1) / self.seconds if self.seconds > 0 else 0.0


def stream_tokens(
    port: int,
    path: str,
    body: dict[str, Any],
    is_token: Callable[[bytes], bool],
    is_end: Callable[[bytes], bool],
    cap: float,
    first_timeout: float,
    host: str = "127.0.0.1",
) -> Decode:
    """Stream a completion and time token arrivals; stop `cap` seconds after the first."""
    conn = http.client.HTTPConnection(host, port, timeout=first_timeout)
    first = last = None
    tokens = 0
    cut = False
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.read()[:300]!r}")
        while True:
            if first is not None:
                remaining = first + cap - time.monotonic()
                if remaining <= 0:
                    cut = True
                    break
                if conn.sock is not None:
                    conn.sock.settimeout(remaining)
            try:
                line = resp.fp.readline()
            except TimeoutError:
                if first is None:
                    raise
                cut = True
                break
            if not line:
                break
            if is_end(line):
                break  # the final object (Ollama keeps the connection open after it)
            if is_token(line):
                last = time.monotonic()
                first = last if first is None else first
                tokens += 1
    finally:
        conn.close()  # the engine cancels the generation at its next write
    if first is None:
        raise RuntimeError(f"{path}: no token streamed")
    end = time.monotonic() if cut else (last or first)
    return Decode(tokens, end - first, cut)


_N_THREADS = re.compile(rb"n_threads\s*=\s*(\d+)")


def threads_in(text: bytes) -> int | None:
    """The thread count an engine reports in its log (llama.cpp's system_info
    `n_threads = N`)."""
    found = _N_THREADS.findall(text)
    return int(found[-1]) if found else None


def threads_from_log(log: Path) -> int | None:
    return threads_in(log.read_bytes())


@dataclass(frozen=True)
class Settings:
    prompt_words: int
    decode_tokens: int
    decode_cap: float  # seconds of decode window per request
    request_timeout: float  # prefill / first token
    reps: int
    slow_seconds: float  # a prefill slower than this is not repeated
    rounds: int = 3  # every point once per round, interleaved (benchmarks/verdict.py)


WARMUP_WORDS = 8
START_TIMEOUT = 180.0  # seconds to healthy: 8 threads on one CPU load slowly


@dataclass(frozen=True)
class Config:
    """One way to start the engine: a thread count (None = the engine's default)."""

    threads: int | None
    args: tuple[str, ...] = ()  # llama-server: the rendered arguments, -t/-tb removed
    env: dict[str, str] = field(default_factory=dict)  # Ollama: the rendered environment
    modelfile: str = ""  # Ollama: the rendered Modelfile (FROM replaced by the local GGUF)


class EngineBench:
    """Starts an engine in the budget and measures prefill and decode."""

    name = ""

    def running(
        self, budget: CpuBudget, config: Config
    ) -> contextlib.AbstractContextManager[tuple[int, Path]]:
        raise NotImplementedError

    def prefill(self, port: int, words: int, tag: int, timeout: float) -> tuple[float, int]:
        raise NotImplementedError

    def decode(self, port: int, tokens: int, tag: int, s: Settings) -> Decode:
        raise NotImplementedError


class LlamaServer(EngineBench):
    name = "llama-server"

    def __init__(self, work: Path) -> None:
        self.work = work

    @contextlib.contextmanager
    def running(self, budget: CpuBudget, config: Config) -> Iterator[tuple[int, Path]]:
        # --no-warmup: our own warm-up request is timed apart (at 8x a warm-up
        # decode alone takes many seconds).
        args = ["--no-warmup"]
        if config.threads is not None:
            args += ["-t", str(config.threads), "-tb", str(config.threads)]
        workdir = self.work / f"llama-{budget.cpus}cpu-{config.threads or 'default'}"
        with engines.llama_server(
            workdir, args, rendered=config.args, preexec=budget.enter(), timeout=START_TIMEOUT
        ) as engine:
            yield engine.port, engine.log

    def prefill(self, port: int, words: int, tag: int, timeout: float) -> tuple[float, int]:
        doc = post_json(
            f"http://127.0.0.1:{port}/completion",
            {"prompt": prompt(words, tag), "n_predict": 1, "cache_prompt": False},
            timeout,
        )
        t = doc["timings"]
        return float(t["prompt_per_second"]), int(t["prompt_n"])

    def decode(self, port: int, tokens: int, tag: int, s: Settings) -> Decode:
        body = {
            "prompt": f"w{tag} Once upon a time",
            "n_predict": tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
        }
        return stream_tokens(
            port,
            "/completion",
            body,
            lambda line: line.startswith(b"data: ") and b'"stop":true' not in line,
            lambda line: b'"stop":true' in line,
            s.decode_cap,
            s.request_timeout,
        )


class Ollama(EngineBench):
    """The real `ollama serve`; the model imported from the local GGUF by `ollama create`."""

    name = "ollama"

    def __init__(self, model: Path, work: Path) -> None:
        self.model, self.work = model, work

    @contextlib.contextmanager
    def running(self, budget: CpuBudget, config: Config) -> Iterator[tuple[int, Path]]:
        label = "operator" if config.modelfile else "default"
        workdir = self.work / f"ollama-{budget.cpus}cpu-{label}"
        # The rendered environment, but for where this one listens and keeps models.
        env = {k: v for k, v in config.env.items() if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}
        with engines.ollama_serve(
            workdir, workdir / "models", env, preexec=budget.enter(), timeout=START_TIMEOUT
        ) as server:
            modelfile = workdir / "Modelfile"
            text = config.modelfile or f"FROM {MODEL_TAG}\n"
            modelfile.write_text(re.sub(r"^FROM .*$", f"FROM {self.model}", text, flags=re.M))
            done = server.cli("create", "bench", "-f", str(modelfile))
            if done.returncode != 0:
                raise RuntimeError(f"ollama create failed:\n{done.stdout}{done.stderr}")
            yield server.port, server.log

    def prefill(self, port: int, words: int, tag: int, timeout: float) -> tuple[float, int]:
        doc = post_json(
            f"http://127.0.0.1:{port}/api/generate",
            {
                "model": "bench",
                "prompt": prompt(words, tag),
                "raw": True,
                "stream": False,
                "options": {"num_predict": 1},
            },
            timeout,
        )
        n = int(doc["prompt_eval_count"])
        return n / (int(doc["prompt_eval_duration"]) / 1e9), n

    def decode(self, port: int, tokens: int, tag: int, s: Settings) -> Decode:
        body = {
            "model": "bench",
            "prompt": f"w{tag} Once upon a time",
            "raw": True,
            "stream": True,
            "options": {"num_predict": tokens, "temperature": 0},
        }
        return stream_tokens(
            port,
            "/api/generate",
            body,
            lambda line: b'"done":false' in line,
            lambda line: b'"done":true' in line,
            s.decode_cap,
            s.request_timeout,
        )


@dataclass
class Point:
    label: str
    config: Config
    threads: int | None = None  # as the engine reported it
    prefill: list[float] = field(default_factory=list)  # one median per round
    prompt_tokens: int = 0
    decode: list[float] = field(default_factory=list)  # one median per round
    cut: bool = False  # decode stopped at the cap: the rate is an upper bound
    same_as: str = ""
    start_seconds: float = 0.0  # start to healthy (Ollama: and `ollama create`)

    @property
    def prefill_tps(self) -> float:
        return statistics.median(self.prefill) if self.prefill else 0.0

    @property
    def decode_tps(self) -> float:
        return statistics.median(self.decode) if self.decode else 0.0

    def measured(self) -> Measured:
        return Measured(self.label, self.threads, tuple(self.decode), self.cut)

    def spread(self) -> str:
        return Spread.of(self.decode).text("{:.1f}") if self.decode else "n/a"


def measure(
    engine: EngineBench, budget: CpuBudget, point: Point, s: Settings, tag: int
) -> None:
    started = time.monotonic()
    try:
        _measure(engine, budget, point, s, tag)
    finally:
        print(
            f"   ... {engine.name} {budget.cpus} CPU, {point.label}: "
            f"{time.monotonic() - started:.0f} s, load {loadavg()}",
            file=sys.stderr,
            flush=True,
        )


def _measure(
    engine: EngineBench, budget: CpuBudget, point: Point, s: Settings, tag: int
) -> None:
    began = time.monotonic()
    with engine.running(budget, point.config) as (port, log):
        point.start_seconds = time.monotonic() - began
        # Warm-up, not counted: first touches of the weights, the first graph.
        engine.prefill(port, WARMUP_WORDS, tag, s.request_timeout)
        point.threads = threads_from_log(log) or point.config.threads
        prefill: list[float] = []
        for i in range(s.reps):
            began = time.monotonic()
            rate, n = engine.prefill(port, s.prompt_words, tag + i + 1, s.request_timeout)
            prefill.append(rate)
            point.prompt_tokens = n
            if time.monotonic() - began > s.slow_seconds:
                break  # collapsed: repeats would only cost time (and the others' CPU)
        point.prefill.append(statistics.median(prefill))
        decode: list[float] = []
        for i in range(s.reps):
            d = engine.decode(port, s.decode_tokens, tag + 50 + i, s)
            decode.append(d.rate)
            if d.cut:
                point.cut = True
                break  # collapsed: one long window says it, more would only cost time
        point.decode.append(statistics.median(decode))


def measure_interleaved(
    engine: EngineBench, budget: CpuBudget, points: dict[str, Point], s: Settings, tag: int,
    warmup: Point | None = None,
) -> None:
    """`points` in rounds (benchmarks/verdict.py), after `warmup` (not kept);
    a collapsed point, or one that is another's run (`same_as`), is measured once."""
    order = interleaved(list(points.values()), s.rounds, warmup)
    for i, (round_, p) in enumerate(order):
        if p.same_as or (round_ > 1 and p.cut):
            continue
        measure(engine, budget, p, s, tag=tag + 1000 * i)


# --- one budget --------------------------------------------------------------------


def ratio(a: float, b: float) -> float | None:
    return a / b if a > 0 and b > 0 else None


@dataclass
class BudgetRun:
    cpus: int
    kind: str
    choice: dict[str, Any]
    points: dict[str, Point]
    ollama: dict[str, Point] | None
    ollama_note: str
    load_before: str
    load_after: str
    throttled: dict[str, int]
    seconds: float

    @property
    def others(self) -> list[Point]:
        """The points whose thread count differs from the operator's (each once)."""
        o = self.points["operator"]
        return [p for p in self.points.values()
                if p is not o and not p.same_as and p.threads != o.threads]

    @property
    def verdict(self) -> Verdict:
        o = self.points["operator"]
        return verdict(o.measured(), [p.measured() for p in self.points.values() if p is not o])

    @property
    def best(self) -> Point | None:
        label = self.verdict.best
        return next((p for p in self.points.values() if p.label == label), None)

    def summary(self) -> dict[str, Any]:
        o, pts = self.points["operator"], self.points
        best_prefill = max(self.others, key=lambda p: p.prefill_tps, default=None)
        judged, best = self.verdict, self.best
        out: dict[str, Any] = {
            "budget_cpus": self.cpus,
            "budget": self.kind,
            "operator_threads": o.threads,
            "default_threads": pts["default"].threads,
            "verdict": judged.kind,
            "best_decode_threads": best.threads if best else None,
            "operator_vs_best_decode": judged.ratio,
            "operator_vs_best_prefill": (
                ratio(o.prefill_tps, best_prefill.prefill_tps) if best_prefill else None),
            "operator_vs_default_decode": ratio(o.decode_tps, pts["default"].decode_tps),
            "operator_vs_default_prefill": ratio(o.prefill_tps, pts["default"].prefill_tps),
        }
        for k in (2, 4, 8):
            if f"{k}x" not in pts:  # --quick leaves out the slowest points
                out[f"operator_vs_{k}x_decode"] = out[f"operator_vs_{k}x_prefill"] = None
                continue
            out[f"operator_vs_{k}x_decode"] = ratio(o.decode_tps, pts[f"{k}x"].decode_tps)
            out[f"operator_vs_{k}x_prefill"] = ratio(o.prefill_tps, pts[f"{k}x"].prefill_tps)
        # When the denominator's decode was cut at the cap its rate is an upper
        # bound, so the operator's ratio over it is a lower bound.
        out["lower_bounds"] = sorted(
            f"operator_vs_{k}_decode"
            for k in ("default", "2x", "4x", "8x")
            if k in pts and pts[k].cut
        )
        if self.ollama:
            oo, od = self.ollama["operator"], self.ollama["default"]
            out["ollama_operator_threads"] = oo.threads
            out["ollama_default_threads"] = od.threads
            out["ollama_operator_vs_default_decode"] = ratio(oo.decode_tps, od.decode_tps)
            out["ollama_operator_vs_default_prefill"] = ratio(oo.prefill_tps, od.prefill_tps)
            out["ollama_default_decode_is_upper_bound"] = od.cut
        else:
            out["ollama"] = self.ollama_note
        out["load_before"], out["load_after"] = self.load_before, self.load_after
        out["throttled"] = self.throttled
        out["seconds"] = round(self.seconds, 1)
        out["points"] = {
            k: {
                "threads": p.threads,
                "prefill_tps": p.prefill,  # one median per round
                "prompt_tokens": p.prompt_tokens,
                "decode_tps": p.decode,  # one median per round
                "decode_cut": p.cut,
                "start_seconds": round(p.start_seconds, 1),
            }
            for k, p in (
                self.points | {f"ollama-{k}": v for k, v in (self.ollama or {}).items()}
            ).items()
        }
        return out


def run_budget(
    llama: EngineBench,
    ollama: EngineBench | None,
    ollama_note: str,
    cpus: int,
    s: Settings,
    quick: bool,
) -> BudgetRun:
    budget = CpuBudget(cpus)
    try:
        before, throttle0, started = loadavg(), budget.throttling(), time.monotonic()
        choice = operator_choice(budget, "llama-server")
        op = int(choice["threads"])
        base = _without_threads(choice["args"])
        wanted: list[tuple[str, str, int | None]] = [
            ("operator", "operator (rules)", op),
            ("default", "engine default", None),
        ]
        # --quick: 4x and 8x take minutes each here (a 270M model needs about
        # 30 s just to load with 8 threads on one CPU); the full run has them.
        over = (2,) if quick else (2, 4, 8)
        wanted += [(f"{k}x", f"{k}x oversubscribed", k * cpus) for k in over]
        # The operator's own count is the operator's command: not a point apart.
        wanted += [(f"sweep{n}", f"sweep {n}", n) for n in range(1, 2 * cpus + 1) if n != op]
        points: dict[str, Point] = {}
        by_threads: dict[int, Point] = {}
        for key, label, threads in wanted:
            if quick and threads is not None and threads in by_threads:
                # --quick: an identical engine command is measured once (the
                # lists are shared: the other's rounds are this one's).
                src = by_threads[threads]
                points[key] = Point(label, src.config, src.threads, src.prefill, 0, src.decode,
                                    same_as=src.label)
                continue
            points[key] = Point(label, Config(threads, args=base))
            if threads is not None:
                by_threads.setdefault(threads, points[key])
        touch(engines.require("model"))
        warmup = Point("warm-up (operator's)", Config(op, args=base))
        measure_interleaved(llama, budget, points, s, 100_000 * cpus, warmup)
        for p in points.values():  # a shared run's facts, once it ran
            if p.same_as:
                src = next(q for q in points.values() if q.label == p.same_as)
                p.threads, p.cut, p.start_seconds = src.threads, src.cut, src.start_seconds
        ollama_points = None
        if ollama is not None:
            rendered = operator_choice(budget, "ollama")
            ollama_points = {
                "operator": Point(
                    "ollama, operator's Modelfile + env",
                    Config(
                        int(rendered["threads"]),
                        env=_ollama_env(rendered["env"]),
                        modelfile=rendered["modelfile"],
                    ),
                ),
                "default": Point("ollama, defaults", Config(None)),
            }
            measure_interleaved(ollama, budget, ollama_points, s, 50_000 + 100_000 * cpus)
        after, throttle1 = loadavg(), budget.throttling()
        seconds = time.monotonic() - started
    finally:
        budget.close()
    return BudgetRun(
        cpus,
        budget.kind,
        choice,
        points,
        ollama_points,
        ollama_note,
        before,
        after,
        {k: v - throttle0.get(k, 0) for k, v in throttle1.items()},
        seconds,
    )


def touch(path: Path) -> None:
    """Read `path` once: the weights in the page cache before the first point."""
    with path.open("rb") as f:
        while f.read(1 << 20):
            pass


def _without_threads(args: list[str]) -> tuple[str, ...]:
    """The rendered llama-server arguments without -t/-tb (each point sets its own)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("-t", "-tb"):
            skip = True
        else:
            out.append(a)
    return tuple(out)


def _ollama_env(rendered: dict[str, str]) -> dict[str, str]:
    """The operator's engine environment, minus what only makes sense in the pod."""
    return {k: v for k, v in rendered.items() if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}


# --- output ------------------------------------------------------------------------


def fmt(value: float | None, prefix: str = "") -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{prefix}{value:.0f}"
    return f"{prefix}{value:.2f}" if value < 10 else f"{prefix}{value:.1f}"


def report(run: BudgetRun) -> list[str]:
    o = run.points["operator"]
    node = run.choice["node"]
    lines = [
        f"== budget {run.cpus} CPU: {run.kind}",
        f"   machine facts read inside it: allocatable {node['allocatable_cpu_milli']}m, "
        f"cpuset {node['cpuset_cpus']}, cgroup quota {node['cgroup_cpu_quota']}",
    ]
    lines += [f"   rule {d}" for d in run.choice["decisions"] if d.startswith("threads")]
    lines.append(
        f"   load average before {run.load_before}, after {run.load_after}; "
        f"cgroup {run.throttled}; {run.seconds:.0f} s"
    )
    head = (
        f"   {'point':<36}{'threads':>8}{'start s':>8}{'prefill tok/s':>15}{'decode tok/s':>14}"
        f"{'op/pt prefill':>15}{'op/pt decode':>14}  decode: median [lowest-highest of rounds]"
    )
    lines.append(head)

    def row(p: Point, ref: Point) -> str:
        notes = []
        if p is run.best:
            notes.append("best decode of the other thread counts")
        if p.same_as:
            notes.append(f"same run as {p.same_as}")
        if p.cut:
            notes.append("decode cut at the cap: upper bound")
        d_ratio = ratio(ref.decode_tps, p.decode_tps)
        return (
            f"   {p.label:<36}{p.threads!s:>8}{p.start_seconds:>8.1f}{fmt(p.prefill_tps):>15}"
            f"{fmt(p.decode_tps, '<' if p.cut else ''):>14}"
            f"{fmt(ratio(ref.prefill_tps, p.prefill_tps)):>15}"
            f"{fmt(d_ratio, '>' if p.cut and not ref.cut else ''):>14}  {p.spread()}"
            + (f"   {'; '.join(notes)}" if notes else "")
        )

    lines += [row(p, o) for p in run.points.values()]
    s = run.summary()
    eight_bound = "operator_vs_8x_decode" in s["lower_bounds"]
    lines.append(f"   llama-server: {run.verdict.text()}")
    lines.append(
        f"   llama-server: prefill operator / best {fmt(s['operator_vs_best_prefill'])}"
        f"; operator / engine default decode "
        f"{fmt(s['operator_vs_default_decode'])}; operator / 8x decode "
        f"{fmt(s['operator_vs_8x_decode'], '>' if eight_bound else '')}"
    )
    if run.ollama:
        oo = run.ollama["operator"]
        lines += [row(p, oo) for p in run.ollama.values()]
        lines.append(
            f"   ollama: operator's Modelfile / defaults decode "
            f"{fmt(s['ollama_operator_vs_default_decode'])}, prefill "
            f"{fmt(s['ollama_operator_vs_default_prefill'])}"
        )
    else:
        lines.append(f"   ollama: not measured ({run.ollama_note})")
    return lines


def smt_group(llama: EngineBench, s: Settings) -> list[str]:
    """No quota: threads = physical cores vs logical CPUs, on SMT machines only."""
    from localmodel.facts.machine import read_machine

    topo = read_machine().topology
    cores, logical = topo.physical_cores or 1, topo.logical_cpus or 1
    if logical <= cores:
        return [f"== SMT: not measured ({logical} logical CPUs on {cores} cores: no SMT here)"]
    budget = CpuBudget.unlimited()
    choice = operator_choice(budget, "llama-server")
    base = _without_threads(choice["args"])
    points = []
    for i, n in enumerate((cores, logical)):
        p = Point(f"{n} threads ({'cores' if n == cores else 'logical CPUs'})", Config(n, base))
        measure(llama, budget, p, s, tag=900_000 + 1000 * i)
        points.append(p)
    first = points[0]
    lines = [f"== SMT, no quota: {logical} logical CPUs, {cores} cores; load {loadavg()}"]
    lines += [
        f"   {p.label:<36}{fmt(p.prefill_tps):>15}{fmt(p.decode_tps):>14}"
        f"{fmt(ratio(p.decode_tps, first.decode_tps)):>10}"
        for p in points
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description="what the thread rule buys, under a CPU quota")
    parser.add_argument("--quick", action="store_true", help="budget 1 only, short; < 60 s")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--budgets", type=int, nargs="+", help="CPU budgets (default 1 2)")
    parser.add_argument("--reps", type=int, help="requests per point per round (median)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (quick 2, full 3)")
    parser.add_argument("--no-ollama", action="store_true", help="skip the Ollama columns")
    parser.add_argument("--operator-choice", metavar="ENGINE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator_choice:
        print(json.dumps(operator_choice_here(args.operator_choice)))
        return 0
    if os.geteuid() != 0:
        print("threads.py needs root to create a cgroup", file=sys.stderr)
        return 2
    try:
        llama_server, model = engines.require("llama-server"), engines.require("model")
    except EngineMissingError as exc:
        print(f"threads.py: {exc}", file=sys.stderr)
        return 2
    ollama_binary = engines.path("ollama")
    host = os.cpu_count() or 1
    budgets = args.budgets or ([1] if args.quick else [b for b in (1, 2) if b <= host])
    if any(b < 1 or b > host for b in budgets):
        print(f"budgets must be 1..{host} (this machine's CPUs)", file=sys.stderr)
        return 2
    if args.quick:
        s = Settings(
            prompt_words=16,
            decode_tokens=24,
            decode_cap=3.0,
            request_timeout=120,
            reps=args.reps or 2,
            slow_seconds=3.0,
            rounds=args.rounds or 2,
        )
    else:
        s = Settings(
            prompt_words=120,
            decode_tokens=64,
            decode_cap=30.0,
            request_timeout=600,
            reps=args.reps or 5,
            slow_seconds=30.0,
            rounds=args.rounds or 3,
        )
    ollama_note = f"no Ollama at {ollama_binary}: bash hack/build-engines.sh ollama"
    if args.no_ollama:
        ollama_note = "--no-ollama"
    elif ollama_binary.exists():
        ollama_note = ""
    work = Path(tempfile.mkdtemp(prefix="threads-bench-"))
    llama = LlamaServer(work)
    ollama = Ollama(model, work) if not ollama_note else None
    print(
        f"threads.py: host {host} CPUs; llama-server {llama_server}; model {model}; "
        f"ollama {ollama_binary if ollama else 'none'} (from hack/build-engines.sh --print); "
        f"{'quick' if args.quick else 'full'}: prompt {s.prompt_words} words, decode "
        f"{s.decode_tokens} tokens capped at {s.decode_cap:.0f} s, {s.reps} reps (median) "
        f"in each of {s.rounds} interleaved rounds"
    )
    runs = []
    try:
        for cpus in budgets:
            run = run_budget(llama, ollama, ollama_note, cpus, s, args.quick)
            runs.append(run)
            print("\n".join(report(run)), flush=True)
        if not args.quick:
            print("\n".join(smt_group(llama, s)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        first = runs[0].summary()
        doc = {k: v for k, v in first.items() if k != "points"}
        doc["budgets"] = [r.summary() for r in runs]
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
