"""Load llama-server once per configuration and record its own memory accounting
(`-lv 4`) and the process's anonymous and file-backed RSS after load: the lines of
tests/fixtures/llama-accounting.jsonl (docs/engine-facts.md, "llama.cpp's own
accounting"). Nice'd; one process at a time.

Usage: python hack/llama-accounting.py LLAMA_SERVER MODEL.gguf SHAPE OUT.jsonl
(LLAMA_SERVER: the binary `bash hack/build-engines.sh` caches; MODEL: a synthetic
GGUF from hack/synth-gguf.py; SHAPE: its name, written into each line).
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ACCOUNTING = re.compile(
    r"(memory breakdown|Host  |CPU_REPACK|model buffer size|compute buffer size"
    r"|output buffer size|llama_kv_cache: size|n_ctx_seq|KV buffer)")
CONTEXTS = (4096, 8192, 16384, 32768)
SLOTS = (1, 4)
KV_FA = (("f16", "off"), ("f16", "on"), ("q8_0", "on"))  # q8_0 without FA: refused by the rules
PORT = 18777


def rss_mib(pid: int) -> dict[str, int]:
    """RssAnon, RssFile, RssShmem and VmRSS of a process in MiB (empty once it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon", "RssFile", "RssShmem", "VmRSS")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) // 1024
    except OSError:
        pass
    return out


def point(binary: str, model: str, ctx: int, slots: int, kv: str, fa: str) -> dict[str, Any]:
    """One load: the engine's accounting lines, its load time and RSS, then a clean stop."""
    args = ["nice", "-n", "19", binary, "-m", model, "-t", "1", "-c", str(ctx),
            "-np", str(slots), "-ctk", kv, "-ctv", kv, "-fa", fa, "--port", str(PORT),
            "--host", "127.0.0.1", "--no-webui", "-lv", "4"]
    began = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        if ACCOUNTING.search(line):
            lines.append(line.strip())
        if "listening on" in line:
            break
    load_s = time.monotonic() - began
    time.sleep(1)
    rss = rss_mib(proc.pid)
    proc.send_signal(signal.SIGTERM)
    lines += [line.strip() for line in proc.stdout if ACCOUNTING.search(line)]
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return {"ctx": ctx, "slots": slots, "kv": kv, "fa": fa, "load_s": round(load_s, 1),
            "rss_mib": rss, "lines": lines}


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    binary, model, shape, out = sys.argv[1:]
    with Path(out).open("a") as f:
        for ctx, slots, (kv, fa) in itertools.product(CONTEXTS, SLOTS, KV_FA):
            rec = {"shape": shape, **point(binary, model, ctx, slots, kv, fa)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(shape, ctx, slots, kv, fa, rec["load_s"], rec["rss_mib"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
