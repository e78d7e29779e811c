"""Memory that holds for weeks: the engines' host-memory prompt cache, bounded
by the operator or left at the engine's default, under many distinct prompts.

Run: python benchmarks/prompt_cache.py [--quick] [--json] [--engines llama-server ollama]
     [--prompts N] [--words W] [--bound auto|QUANTITY]
Needs: the real llama-server, Ollama and the Gemma 3 270M GGUF (`bash
hack/build-engines.sh`; found, started and stopped by tests/harness/engines.py).

Method
- The engine runs as the pod renders it: a LocalModel for the test model with
  one CPU (`cpu: 1`), CONTEXT tokens and one slot is planned onto this machine
  and evaluated by the project's rules (`desired.desired_state`), with
  `promptCache: --bound`. llama-server gets the rendered arguments (model path,
  host and port replaced for this machine); Ollama gets the rendered
  environment (but where it listens and keeps models) and the rendered
  Modelfile (FROM the local GGUF).
- Two runs per engine, each a fresh engine: `bounded`, exactly as rendered
  (llama-server `--cache-ram`, Ollama `LLAMA_ARG_CACHE_RAM`), and `default`,
  the same without that one setting: the engine's own default (8192 MiB).
- Each run sends `--prompts` distinct prompts of about `--words` words (a
  different first word and a different word sequence each, so no prompt
  shares a prefix with another) one after another, one token generated each,
  through the engine's own completion route (llama-server `/completion`,
  Ollama `/api/generate`, raw), the prompt cache on as it is by default.
- After each answer the resident set size (RSS) of the process that keeps the
  cache is read: llama-server itself, or Ollama's llama-server child (the
  `ollama serve` parent's own RSS is printed apart; it keeps no prompt state).
- Evictions: how often the engine's log says it removed a cached prompt to stay
  under its bound ("removing oldest entry"): the bound was crossed that often.

Columns: RSS in MiB after prompt i, per engine and run; a summary per run
(first, peak and last RSS, growth from the first prompt, evictions). `--json`
prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

import psutil  # noqa: E402

from tests.harness import engines  # noqa: E402
from tests.harness.engines import MODEL_TAG  # noqa: E402

CONTEXT = 4096
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
START_TIMEOUT = 300.0
REQUEST_TIMEOUT = 900.0  # one long prompt on one loaded CPU
EVICTION = re.compile(r"removing oldest entry")
WORDS = [
    "river", "stone", "lantern", "orbit", "maple", "quartz", "harbor", "violet", "ember",
    "falcon", "meadow", "cobalt", "thunder", "willow", "copper", "glacier", "saffron",
    "canyon", "whisper", "beacon", "marble", "tundra", "velvet", "cedar", "comet", "prism",
    "summit", "ivory", "nectar", "breeze", "granite", "lotus", "ripple", "aurora", "basalt",
    "juniper", "mosaic", "nimbus", "obsidian", "pepper", "quiver", "raven", "sable",
    "tango", "umber", "vortex", "zephyr",
]


def prompt(tag: int, words: int) -> str:
    """A prompt no other tag shares a prefix with: its own first word and sequence."""
    rng = random.Random(tag)
    return f"p{tag} " + " ".join(rng.choice(WORDS) for _ in range(words - 1))


def rendered(engine: str, bound: str) -> dict[str, Any]:
    """What the project's rules render for the test model on this machine."""
    from localmodel.api import parse_local_model
    from localmodel.desired import desired_state
    from localmodel.engines.ollama.pod import modelfile
    from localmodel.facts.machine import from_this_machine

    lm = parse_local_model({
        "apiVersion": "localmodel.dev/v1alpha1",
        "kind": "LocalModel",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "model": MODEL_TAG, "cpu": 1, "context": CONTEXT, "slots": 1,
            "promptCache": bound, "engine": {"name": engine},
            "gguf": {"url": "https://models.invalid/m.gguf", "sha256": GGUF_SHA256},
        },
    })
    result = desired_state([lm], [from_this_machine()], now="1970-01-01T00:00:00Z").models[0]
    if not result.replicas:
        raise SystemExit(f"the planner placed nothing here: {result.status.conditions}")
    tuning = result.replicas[0].tuning
    return {
        "args": list(tuning.args),
        "env": dict(tuning.env),
        "modelfile": modelfile(lm, tuning) if engine == "ollama" else "",
        "memory_mib": tuning.memory_bytes // 2**20,
        "decisions": [f"{d.rule}: {d.effect}" for d in tuning.decisions
                      if d.rule.startswith(("prompt-cache", "memory"))],
    }


def without_bound(r: dict[str, Any]) -> dict[str, Any]:
    """The same settings but the prompt cache's bound: the engine's default."""
    args = list(r["args"])
    if "--cache-ram" in args:
        i = args.index("--cache-ram")
        del args[i:i + 2]
    env = {k: v for k, v in r["env"].items() if k != "LLAMA_ARG_CACHE_RAM"}
    return r | {"args": args, "env": env}


@dataclass
class Engine:
    """A running engine: where to send prompts, whose RSS to read, its log."""

    url: str
    body: dict[str, Any]
    cache_pid: int
    parent_pid: int | None
    log: Path
    extra_logs: list[Path] = field(default_factory=list)

    def ask(self, text: str) -> None:
        import urllib.request

        data = json.dumps(self.body | {"prompt": text}).encode()
        req = urllib.request.Request(self.url, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
            resp.read()

    def rss(self) -> tuple[float, float | None]:
        cache = psutil.Process(self.cache_pid).memory_info().rss / 2**20
        parent = (psutil.Process(self.parent_pid).memory_info().rss / 2**20
                  if self.parent_pid else None)
        return cache, parent

    def evictions(self) -> int:
        return sum(len(EVICTION.findall(p.read_text(errors="replace")))
                   for p in [self.log, *self.extra_logs] if p.exists())


@contextlib.contextmanager
def start(engine: str, settings: dict[str, Any], work: Path) -> Iterator[Engine]:
    if engine == "llama-server":
        with engines.llama_server(work, rendered=settings["args"],
                                  timeout=START_TIMEOUT) as server:
            yield Engine(f"{server.url}/completion", {"n_predict": 1},
                         server.process.pid, None, server.log)
        return
    env = {k: v for k, v in settings["env"].items()
           if k not in ("OLLAMA_HOST", "OLLAMA_MODELS")}
    with engines.ollama_serve(work, work / "models", env, timeout=START_TIMEOUT) as server:
        mf = work / "Modelfile"
        mf.write_text(re.sub(r"^FROM .*$", f"FROM {engines.require('model')}",
                             settings["modelfile"], flags=re.M))
        done = server.cli("create", "bench", "-f", str(mf))
        if done.returncode != 0:
            raise RuntimeError(f"ollama create failed:\n{done.stdout}{done.stderr}")
        body = {"model": "bench", "raw": True, "stream": False, "options": {"num_predict": 1}}
        status, _ = server.api("/api/generate", {"model": "bench"}, timeout=START_TIMEOUT)
        if status != 200:
            raise RuntimeError(f"loading the model answered {status}")
        runner = server.runner()
        yield Engine(f"{server.url}/api/generate", body, runner.pid,
                     server.process.pid, server.log)


def run(engine: str, label: str, settings: dict[str, Any], prompts: int, words: int,
        work: Path) -> dict[str, Any]:
    points: list[dict[str, Any]] = []
    began = time.monotonic()
    with start(engine, settings, work / f"{engine}-{label}") as e:
        idle, idle_parent = e.rss()
        for i in range(prompts):
            e.ask(prompt(i, words))
            rss, parent = e.rss()
            points.append({"prompt": i + 1, "s": round(time.monotonic() - began, 1),
                           "rss_mib": round(rss, 1),
                           "parent_rss_mib": None if parent is None else round(parent, 1)})
            print(f"  {engine} {label}: prompt {i + 1}/{prompts} rss {rss:.0f} MiB",
                  file=sys.stderr, flush=True)
        evictions = e.evictions()
    rss = [p["rss_mib"] for p in points]
    return {"engine": engine, "run": label, "idle_rss_mib": round(idle, 1),
            "idle_parent_rss_mib": None if idle_parent is None else round(idle_parent, 1),
            "first_rss_mib": rss[0], "peak_rss_mib": max(rss), "last_rss_mib": rss[-1],
            "growth_mib": round(rss[-1] - rss[0], 1), "evictions": evictions,
            "seconds": round(time.monotonic() - began, 1), "points": points}


def table(runs: list[dict[str, Any]], every: int) -> str:
    names = [f"{r['engine']}/{r['run']}" for r in runs]
    lines = ["| prompt | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(runs)]
    n = max(len(r["points"]) for r in runs)
    for i in range(n):
        if (i + 1) % every and i + 1 != n and i:
            continue
        cells = [f"{r['points'][i]['rss_mib']:.0f}" if i < len(r["points"]) else ""
                 for r in runs]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few short prompts (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--engines", nargs="+", default=["llama-server", "ollama"])
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--words", type=int, default=None)
    ap.add_argument("--bound", default=None,
                    help="spec.promptCache for the bounded runs (default: auto; quick: 8Mi)")
    ap.add_argument("--runs", nargs="+", default=["bounded", "default"])
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    prompts = a.prompts or (10 if a.quick else 200)
    words = a.words or (100 if a.quick else 300)
    a.bound = a.bound or ("8Mi" if a.quick else "auto")
    import tempfile

    # A work directory of its own (each engine's copy of the model, ~0.5 GB) is
    # removed at the end; one given with --work is kept.
    work = a.work or Path(tempfile.mkdtemp(prefix="prompt-cache-"))
    runs = []
    try:
        for engine in a.engines:
            settings = rendered(engine, a.bound)
            print(f"{engine}: memory {settings['memory_mib']} MiB as rendered; "
                  + "; ".join(settings["decisions"]), flush=True)
            for label in a.runs:
                s = settings if label == "bounded" else without_bound(settings)
                r = run(engine, label, s, prompts, words, work)
                r["memory_limit_mib"] = settings["memory_mib"]
                runs.append(r)
                print(f"{engine}/{label}: RSS first {r['first_rss_mib']:.0f} peak "
                      f"{r['peak_rss_mib']:.0f} last {r['last_rss_mib']:.0f} MiB, growth "
                      f"{r['growth_mib']:+.0f} MiB over {prompts} prompts, evictions "
                      f"{r['evictions']}, {r['seconds']:.0f} s", flush=True)
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(runs, max(1, prompts // 12)))
    if a.json:
        print(json.dumps({"quick": a.quick, "prompts": prompts, "words": words,
                          "bound": a.bound, "context": CONTEXT, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
