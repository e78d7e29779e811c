"""Sessions that stay where their prompt is cached: two REAL llama-server
replicas behind their real gateways, one multi-turn workload routed three
ways in one run.

Run: python benchmarks/router.py [--quick] [--sessions N] [--turns T] [--words W]
       [--think S] [--rounds R] [--json]
Needs: the real llama-server and the Gemma 3 270M GGUF (`bash
hack/build-engines.sh`; started and stopped by tests/harness/engines.py).

Method
- Two llama-servers, one thread and one slot each (`-t 1 -np 1`, the prompt
  cache on as by default, with its host-memory cache, so a replica keeps
  several conversations' prefixes), each behind a real gateway
  (`localmodel.gateway`, in this process, calibrated at readiness so /speed
  knows its prefill rate), and the router (`localmodel.router`, in this
  process, static replicas with their admin ports).
- The workload: `--sessions` conversations run at once, each `--turns` turns
  one after another (a system prompt, then per turn a user message of about
  `--words` words; the answer, `MAX_TOKENS` tokens, joins the history). Between
  two turns the user reads and types: a pause drawn (seeded, the same in every
  mode) between a tenth of `--think` seconds and `--think` seconds. Without it
  every session fires its next turn the moment its answer ends, two sessions
  sharing a one-slot replica collide on about half their turns, and the time
  to first token is two clusters (waited or not) whose median flips between
  them from run to run. One session is compacted half-way: its history is
  replaced by a short summary (a rewrite, which every routing pays alike).
  Half-way too a background job (`X-Priority: background`, a long prompt)
  arrives at the first replica; refused with 429 while no slot is free, it
  retries every half second as jobs do, so it runs in every mode.
- Routed three ways, one after another on the same replicas, with the same
  texts and pauses in a round (a paired comparison; a mode tag at the start
  of every system prompt keeps each mode's cache its own): `random` (each
  turn to a replica at random, seeded: what a Service does), `router`
  (through the router, each session named by `X-LocalModel-Session`),
  `pinned` (each session always on one replica, by hand: the ideal; the
  sessions dealt out evenly in an order drawn per round, so which sessions
  share a replica changes from round to round as it does for the router,
  whose hashing sees new names each round). With `--rounds R` (default 2; 1
  with `--quick`) the three run R times, every other round in reverse order
  (random, router, pinned, pinned, router, random...), each round with texts
  of its own, and the turns are pooled: a machine whose load drifts during
  the run then weighs on every mode alike.
- The defaults (4 sessions x 6 turns of 160 words, pauses up to 20 s, 2
  rounds) and `--quick` (2 sessions x 3 turns of 40 words, pauses up to 1 s,
  1 round: CI checks the columns, not the targets) are docs/benchmarks.md's.
- Measured per turn: time to first token (streamed, to the first content
  chunk). From the gateways' ledgers (GET /ledger): per turn, the prompt
  tokens the engine evaluated beyond what the turn added (its prompt minus the
  previous turn's prompt and answer): that is history read again; its seconds
  are the turn's prefill seconds in proportion. Completed turns per minute of
  the mode's wall time.

Targets (issue 32): the router's p50 time to first token within 1.15x of
pinned; at least 5x fewer re-read seconds than random.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from localmodel.gateway.owned import RouterMarks  # noqa: E402
from localmodel.gateway.server import RunningGateway, start_gateway  # noqa: E402
from localmodel.gateway_contract import GatewayConfig  # noqa: E402
from localmodel.router.config import RouterConfig  # noqa: E402
from localmodel.router.server import RunningRouter, start_router  # noqa: E402
from localmodel.router.static import static_source  # noqa: E402
from tests.harness import engines  # noqa: E402
from tests.harness.engines import MODEL_TAG, LlamaServer  # noqa: E402

ENGINE_ARGS = ["-c", "4096", "-np", "1", "-t", "1", "--metrics", "--slots", "--no-warmup"]
WORDS = 160  # a user turn: a question with some pasted context (about 210 tokens)
THINK_S = 20.0  # the most a user pauses between two turns (reading, typing)
MAX_TOKENS = 12
JOB_RETRY_S = 0.5  # the background job's pause after a 429
JOB_TRIES = 600
MODES = ("random", "router", "pinned")
DEBUG = False
_TEXT = ("cpu cache prompt token replica session engine thread model answer history "
         "kernel memory queue slot router gateway cluster node pod latency prefill decode "
         "summary question river mountain garden window letter planet music paper")
VOCAB = tuple(_TEXT.split(" "))


@dataclass
class Turn:
    mode: str
    session: int
    turn: int
    ttft: float | None
    replica: str
    route: str = ""


@dataclass
class ModeResult:
    turns: list[Turn] = field(default_factory=list)
    wall: float = 0.0
    reread_s: float = 0.0
    reread_tokens: int = 0
    spilled: int = 0
    job_tries: int = 0


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


@contextlib.contextmanager
def two_engines(work: Path) -> Iterator[list[LlamaServer]]:
    with (engines.llama_server(work / "a", ENGINE_ARGS) as a,
          engines.llama_server(work / "b", ENGINE_ARGS) as b):
        yield [a, b]


async def start_gateways(engs: list[LlamaServer]) -> list[RunningGateway]:
    base = GatewayConfig(engine="llama-server", model=MODEL_TAG, slots=1, threads=1,
                         context=4096, listen_host="127.0.0.1", listen_port=0,
                         admin_listen=("127.0.0.1", 0), max_queue=64)
    gateways = [await start_gateway(replace(base, upstream=e.url), lambda _line: None)
                for e in engs]
    async with aiohttp.ClientSession() as http:
        for gw in gateways:  # ready: the engine serves and the speed is calibrated
            for _ in range(600):
                async with http.get(gw.url + "/readyz") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.5)
            else:
                raise SystemExit(f"gateway {gw.url} never became ready")
    return gateways


async def one_turn(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                   headers: dict[str, str]) -> tuple[float | None, str, dict[str, str]]:
    """Stream one chat turn; (time to first token, the answer, response headers)."""
    body = {"model": MODEL_TAG, "messages": messages, "max_tokens": MAX_TOKENS,
            "stream": True, "temperature": 0}
    started = time.monotonic()
    first: float | None = None
    parts: list[str] = []
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise SystemExit(f"turn failed: {resp.status} {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = (choices[0].get("delta") or {}).get("content")
            if piece:
                first = first if first is not None else time.monotonic() - started
                parts.append(piece)
        return first, "".join(parts), dict(resp.headers)


@dataclass(frozen=True)
class Workload:
    sessions: int
    turns: int
    words: int = WORDS
    think_s: float = THINK_S
    job_at: float = 20.0


async def session(http: aiohttp.ClientSession, mode: str, round_no: int, i: int,
                  work: Workload, target: Any, out: ModeResult, compact: bool) -> None:
    # The same texts and pauses in every mode of a round (a paired comparison);
    # the tag in the system prompt keeps each mode's cache its own.
    tag = f"{mode}-r{round_no}"
    rng = random.Random(f"text-r{round_no}-{i}")
    pauses = random.Random(f"think-r{round_no}-{i}")
    turns = work.turns
    messages = [{"role": "system", "content": f"[{tag} run] You are assistant {i}. "
                 f"Answer briefly. Topic: {words(rng, 30)}"}]
    name = f"bench-{tag}-{i}"
    for t in range(turns):
        if compact and t == turns // 2:
            messages = [messages[0], {"role": "assistant",
                                      "content": f"Summary so far: {words(rng, 25)}"}]
        if t and work.think_s > 0:
            await asyncio.sleep(pauses.uniform(work.think_s / 10, work.think_s))
        messages.append({"role": "user", "content": words(rng, work.words)})
        url = target(i, t)
        ttft, answer, headers = await one_turn(
            http, url, messages, {"X-LocalModel-Session": name})
        route = headers.get("X-LocalModel-Route", "")
        out.spilled += route.startswith("spilled")
        if DEBUG:
            print(mode, i, t, url, headers.get("X-LocalModel-Replica"), route, ttft)
        out.turns.append(Turn(mode, i, t, ttft, headers.get("X-LocalModel-Replica", url),
                              route))
        messages.append({"role": "assistant", "content": answer})


async def background_job(http: aiohttp.ClientSession, url: str, delay: float) -> int:
    """The job's tries until a slot took it (429 while none is free)."""
    await asyncio.sleep(delay)
    body = {"model": MODEL_TAG, "max_tokens": 48, "stream": False,
            "messages": [{"role": "user", "content": words(random.Random(7), 200)}]}
    for tries in range(1, JOB_TRIES + 1):
        async with http.post(url + "/v1/chat/completions", json=body,
                             headers={"X-Priority": "background"}) as resp:
            await resp.read()
            if resp.status != 429:
                if resp.status != 200:
                    raise SystemExit(f"the background job failed: {resp.status}")
                return tries
        await asyncio.sleep(JOB_RETRY_S)
    raise SystemExit(f"the background job found no free slot in {JOB_TRIES} tries")


def pinning(sessions: int, replicas: int, round_no: int) -> list[int]:
    """Each session's replica when pinned by hand: dealt out evenly, in an
    order drawn per round (which sessions share a replica changes from round
    to round, as the router's hashing changes it with the round's names)."""
    order = list(range(sessions))
    random.Random(f"pinned-r{round_no}").shuffle(order)
    where = [0] * sessions
    for position, i in enumerate(order):
        where[i] = position % replicas
    return where


async def run_mode(mode: str, gateways: list[RunningGateway], router: RunningRouter,
                   work: Workload, round_no: int) -> ModeResult:
    """One round of one mode, its texts, names and cache its own."""
    out = ModeResult()
    rng = random.Random(f"{mode}-r{round_no}")
    urls = [g.url for g in gateways]
    pinned = pinning(work.sessions, len(urls), round_no)

    def target(i: int, t: int) -> str:
        if mode == "random":
            return rng.choice(urls)
        if mode == "pinned":
            return urls[pinned[i]]
        return router.url

    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        tries, *_ = await asyncio.gather(
            background_job(http, urls[0], work.job_at),
            *(session(http, mode, round_no, i, work, target, out, compact=(i == 0))
              for i in range(work.sessions)))
        out.job_tries = tries or 0
        out.wall = time.monotonic() - started
        out.reread_tokens, out.reread_s = await reread_from_ledgers(
            http, gateways, f"{mode}-r{round_no}")
    return out


async def reread_from_ledgers(http: aiohttp.ClientSession, gateways: list[RunningGateway],
                              tag: str) -> tuple[int, float]:
    """History read again in this mode's turns, from both gateways' ledgers."""
    records: list[dict[str, Any]] = []
    for gw in gateways:
        async with http.get(gw.admin_url + "/ledger") as resp:
            doc = await resp.json()
        entries = doc.get("entries", doc) if isinstance(doc, dict) else doc
        records += [e for e in entries if str(e.get("session", "")).startswith(f"bench-{tag}-")]
    if DEBUG:
        for e in sorted(records, key=lambda e: e["arrival"]):
            print(tag, e["session"], e["prompt_tokens"], e["cached_tokens"],
                  e["evaluated_tokens"], e["generated_tokens"], e["prefill_s"], e["ttft_s"])
    return reread(records)


def reread(records: list[dict[str, Any]]) -> tuple[int, float]:
    """Per session in arrival order: evaluated tokens beyond the turn's new
    ones (its prompt minus the previous prompt and answer; a shorter prompt,
    the compaction, is all new)."""
    tokens, seconds = 0, 0.0
    by_session: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(records, key=lambda e: e["arrival"]):
        by_session.setdefault(e["session"], []).append(e)
    for turns in by_session.values():
        before = 0
        for e in turns:
            prompt, evaluated = e.get("prompt_tokens") or 0, e.get("evaluated_tokens") or 0
            new = prompt - before if prompt >= before else prompt
            again = max(0, evaluated - new)
            if again and evaluated and e.get("prefill_s"):
                tokens += again
                seconds += e["prefill_s"] * again / evaluated
            before = prompt + (e.get("generated_tokens") or 0)
    return tokens, seconds


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(results: dict[str, ModeResult]) -> tuple[list[str], dict[str, Any]]:
    rows: dict[str, dict[str, float]] = {}
    for mode, r in results.items():
        ttfts = [t.ttft for t in r.turns if t.ttft is not None]
        rows[mode] = {"ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
                      "reread_s": r.reread_s, "reread_tokens": r.reread_tokens,
                      "turns_per_min": 60 * len(r.turns) / r.wall if r.wall else 0.0,
                      "turns": len(r.turns), "spilled": r.spilled}
    lines = [f"{'':24}" + "".join(f"{m:>12}" for m in rows)]
    for key, label, fmt in (("ttft_p50_s", "ttft p50 s", "{:12.2f}"),
                            ("ttft_p99_s", "ttft p99 s", "{:12.2f}"),
                            ("reread_s", "re-read prefill s", "{:12.1f}"),
                            ("reread_tokens", "re-read tokens", "{:12.0f}"),
                            ("turns_per_min", "turns per minute", "{:12.2f}"),
                            ("turns", "turns", "{:12.0f}"),
                            ("spilled", "spilled turns", "{:12.0f}")):
        lines.append(f"{label:24}" + "".join(fmt.format(rows[m][key]) for m in rows))
    p50_ratio = rows["router"]["ttft_p50_s"] / rows["pinned"]["ttft_p50_s"]
    fewer = rows["random"]["reread_s"] / max(rows["router"]["reread_s"], 1e-9)
    summary = {**{f"{m}_{k}": v for m, row in rows.items() for k, v in row.items()},
               "router_vs_pinned_p50": p50_ratio, "random_vs_router_reread": fewer}
    lines.append(f"router p50 time to first token / pinned: {p50_ratio:.2f}x "
                 f"(target <= 1.15x: {'met' if p50_ratio <= 1.15 else 'NOT met'})")
    lines.append(f"re-read seconds, random / router: {fewer:.1f}x "
                 f"(target >= 5x: {'met' if fewer >= 5 else 'NOT met'})")
    # Pinned's re-reads are the floor no routing removes (module docstring): the
    # most any routing can save is random / pinned.
    ceiling = rows["random"]["reread_s"] / max(rows["pinned"]["reread_s"], 1e-9)
    beyond = rows["router"]["reread_tokens"] - rows["pinned"]["reread_tokens"]
    summary.update(random_vs_pinned_reread=ceiling, router_reread_tokens_beyond_pinned=beyond)
    lines.append(f"re-read seconds, random / pinned (the most routing can save): "
                 f"{ceiling:.1f}x; router's re-read tokens beyond pinned's: {beyond:+.0f}")
    return lines, summary


def merged(into: ModeResult, one: ModeResult) -> None:
    into.turns += one.turns
    into.wall += one.wall
    into.reread_s += one.reread_s
    into.reread_tokens += one.reread_tokens
    into.spilled += one.spilled


async def run(work: Workload, rounds: int = 1) -> tuple[list[str], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp, \
            two_engines(Path(tmp)) as engs:
        gateways = await start_gateways(engs)
        replicas = ",".join(f"{g.url}|{g.admin_url}" for g in gateways)
        key = Ed25519PrivateKey.generate()
        for gw in gateways:  # as the operator renders them: the router's marks are checked
            gw.gateway.pipeline.marks = RouterMarks(key.public_key(), "static", gw.url)
        config = RouterConfig(listen_host="127.0.0.1", listen_port=0, admin_host="127.0.0.1",
                              admin_port=0, poll_interval=0.5, signing_key=key)
        router = await start_router(config, static_source([f"{MODEL_TAG}={replicas}"]),
                                    lambda _line: None)
        try:
            results = {mode: ModeResult() for mode in MODES}
            for r in range(rounds):  # every other round backwards: the machine's drift cancels
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    one = await run_mode(mode, gateways, router, work, r)
                    merged(results[mode], one)
                    print(f"round {r + 1}, {mode}: {len(one.turns)} turns in {one.wall:.0f} s, "
                          f"re-read {one.reread_s:.1f} s, {one.spilled} spilled, "
                          f"background job ran at try {one.job_tries}", flush=True)
        finally:
            await router.stop()
            for gw in gateways:
                await gw.stop()
    return report(results)


def main() -> int:
    parser = argparse.ArgumentParser(description="the router against random and pinned routing")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--words", type=int, default=None,
                        help=f"words in each user message (default {WORDS}; --quick: 40)")
    parser.add_argument("--think", type=float, default=None,
                        help="the most seconds a user pauses between turns; 0: none "
                             f"(default {THINK_S:g}; --quick: 1)")
    parser.add_argument("--job-at", type=float, default=20.0,
                        help="seconds into each mode the background job arrives")
    parser.add_argument("--rounds", type=int, default=None,
                        help="run the modes this many times, every other round in reverse "
                             "order, and pool the turns (default 2; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="2 sessions of 3 turns (CI)")
    parser.add_argument("--json", action="store_true", help="a JSON summary as the last line")
    parser.add_argument("--debug", action="store_true", help="print every turn and record")
    args = parser.parse_args()
    global DEBUG
    DEBUG = args.debug
    if args.quick:
        args.sessions, args.turns, args.job_at = 2, 3, 2.0
    quick = {"rounds": 1, "words": 40, "think": 1.0}
    full = {"rounds": 2, "words": WORDS, "think": THINK_S}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:  # a value given on the command line stays
            setattr(args, name, value)
    for name in ("sessions", "turns", "words", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} is not a positive number")
    if args.think < 0:
        parser.error(f"--think: {args.think} is negative")
    print(f"router benchmark: {args.sessions} sessions x {args.turns} turns of "
          f"{args.words} words, pauses up to {args.think:g} s, 2 llama-server replicas "
          f"(1 thread, 1 slot each), modes {', '.join(MODES)}, {args.rounds} round(s)",
          flush=True)
    work = Workload(args.sessions, args.turns, args.words, args.think, args.job_at)
    lines, summary = asyncio.run(run(work, args.rounds))
    print("\n".join(lines))
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
