"""llama-server's decode of the synthetic real-shape models against the memory-bandwidth ceiling
`localmodel.ceiling.predicted_decode` predicts.

    python benchmarks/ceiling.py --shape qwen3-8b --threads 1 [--repeats 5] [--out FILE.jsonl]

One shape and thread count per run (a run is bounded: one engine, loaded once; run it under
the machine's engine lock). The server is started through the test harness with the shape's
GGUF (built and checked by `hack/synth-gguf.py`), ``-t``/``-tb`` = the threads, one slot of
2048 tokens, flash attention on. Then, ``--repeats`` times, interleaved: the probe's bandwidth
measurement at those threads (`localmodel.probe.stream.measure` over ARRAY_LLC_MULTIPLE x the
last-level cache), and one decode of ``--tokens`` tokens of a fixed prompt (the engine's own
``timings.predicted_per_second``). The prediction is the bandwidth measured just before,
over the weights one token reads (`weights_read_per_token` from the file's own tensors) and
the KV cache read at the decode's mean context. One JSON line per point (appended to
``--out``; points already there are skipped, so a cut run resumes), and the median ratio
with its spread on stderr. ``--quick`` (CI): gemma3-1b, one thread, one point of 8 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from localmodel.ceiling import predicted_decode, weights_read_per_token
from localmodel.probe.bandwidth import ARRAY_LLC_MULTIPLE, last_level_cache, read_cache_entries
from localmodel.probe.stream import measure

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Count the ways a memory bus can be kept busy, one per line, and explain each:"


def synth_path(shape: str) -> Path:
    """The shape's built file (hack/synth-gguf.py writes and checks it; its sha256 mark beside)."""
    from tests.harness.tools import cache_dir

    for path in sorted((cache_dir() / "models/synth").glob(f"{shape}-q4_k_m-v*.gguf")):
        if path.with_name(path.name + ".sha256-ok").exists():
            return path
    raise SystemExit(f"{shape}: not built (python hack/synth-gguf.py {shape})")


def file_shape(path: Path) -> dict[str, Any]:
    """The bytes one token reads of the file's weights, and its KV shape (every layer full:
    the decode's context is below any sliding window)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")

    def number(key: str) -> int:
        field = reader.fields[f"{arch}.{key}"]
        return int(field.parts[field.data[0]][0])

    kv_per_token = (number("block_count") * number("attention.head_count_kv")
                    * (number("attention.key_length") + number("attention.value_length")) * 2)
    return {"file_bytes": path.stat().st_size, "tensor_bytes": sum(tensors.values()),
            "weights_read": weights_read_per_token(tensors, int(embd.shape[1])),
            "tied": "output.weight" not in tensors, "kv_bytes_per_token": kv_per_token}


def done(out: Path) -> set[tuple[str, int, int]]:
    if not out.exists():
        return set()
    keys = set()
    for line in out.read_text().splitlines():
        row = json.loads(line)
        keys.add((row["shape"], row["threads"], row["repeat"]))
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="gemma3-1b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("ceiling.jsonl"))
    parser.add_argument("--quick", action="store_true",
                        help="CI: the smallest shape, one thread, one point of 8 tokens")
    args = parser.parse_args()
    if args.quick:
        args.shape, args.threads, args.repeats, args.tokens = "gemma3-1b", 1, 1, 8
    sys.path.insert(0, str(ROOT))
    from tests.harness.engines import llama_server

    path = synth_path(args.shape)
    shape = file_shape(path)
    cache = last_level_cache(read_cache_entries(Path("/")))
    assert cache is not None
    llc = cache.one if args.threads == 1 else cache.total
    skip = done(args.out)
    todo = [r for r in range(args.repeats) if (args.shape, args.threads, r) not in skip]
    flags = ["-m", str(path), "-t", str(args.threads), "-tb", str(args.threads), "-c", "2048",
             "-np", "1", "-fa", "on", "--no-webui"]
    with tempfile.TemporaryDirectory() as tmp, llama_server(Path(tmp), flags,
                                                             timeout=900) as engine:
        body = {"prompt": PROMPT, "n_predict": args.tokens, "temperature": 0,
                "ignore_eos": True, "cache_prompt": False}
        engine.api("/completion", {**body, "n_predict": 4})  # warm: first touches, repack
        for r in todo:
            bw = measure(ARRAY_LLC_MULTIPLE * llc, args.threads)
            status, answer = engine.api("/completion", body)
            assert status == 200, answer
            timings = answer["timings"]
            context = timings["prompt_n"] + timings["predicted_n"] / 2
            kv = int(shape["kv_bytes_per_token"] * context)
            predicted = predicted_decode(bw.bytes_per_second, shape["weights_read"], kv,
                                         int(context))
            row = {"shape": args.shape, "threads": args.threads, "repeat": r,
                   "load": os.getloadavg(), **shape, "bandwidth": bw.bytes_per_second,
                   "bandwidth_wall": bw.wall_bytes_per_second,
                   "decode": timings["predicted_per_second"],
                   "decoded": timings["predicted_n"], "prompt_n": timings["prompt_n"],
                   "predicted": predicted.tokens_per_second, "describe": predicted.describe,
                   "ratio": timings["predicted_per_second"] / predicted.tokens_per_second}
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{args.shape} t={args.threads} #{r}: {row['decode']:.2f} tok/s of "
                  f"{row['predicted']:.2f} ({row['ratio']:.2f}); {predicted.describe}",
                  file=sys.stderr, flush=True)
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    ratios = [r["ratio"] for r in rows if r["shape"] == args.shape
              and r["threads"] == args.threads]
    print(f"{args.shape} t={args.threads}: median ratio {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
