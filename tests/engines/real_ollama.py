"""The Ollama model store ("the volume") for the engine and gateway tiers, and
watching an engine's CPU. `ollama serve` itself is started, waited for and
stopped by tests/harness/engines.py.

The store holds the Gemma 3 270M GGUF imported once with `FROM
/path/model.gguf`; each test gets its own copy with the blobs hard-linked, so a
test may create or delete models freely.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil

from tests.harness.engines import MODEL_TAG, ollama_serve, require

MODEL = MODEL_TAG  # the name the catalog knows, so rendered pods size it right


def import_gguf(workdir: Path, models: Path, name: str = MODEL) -> None:
    """Import the GGUF into the store under `name`, offline (`FROM /path`)."""
    gguf = require("model")
    workdir.mkdir(parents=True, exist_ok=True)
    modelfile = workdir / "Import.Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    with ollama_serve(workdir, models) as server:
        done = server.cli("create", name, "-f", str(modelfile))
        assert done.returncode == 0, done.stdout + done.stderr


def copy_volume(src: Path, dst: Path) -> None:
    """A writable copy of a model store: blobs hard-linked (content-addressed,
    never rewritten), everything else copied."""

    def link_or_copy(s: str, d: str) -> None:
        if f"{os.sep}blobs{os.sep}" in s:
            os.link(s, d)
        else:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def wait_idle(p: psutil.Process, timeout: float, window: float = 1.0, busy: float = 0.1) -> float:
    """Seconds until `p` used less than `busy` CPU seconds in one `window`."""
    start = time.monotonic()
    last = cpu_seconds(p)
    while True:
        time.sleep(window)
        now = cpu_seconds(p)
        used, last = now - last, now
        if used < busy:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"still busy after {timeout} s ({used:.2f} CPU s in {window} s)")
