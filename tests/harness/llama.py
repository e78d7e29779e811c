"""A real llama-server (built by hack/build-engines.sh) for tests outside the
gateway tier: where it lives, and a process that is started, waited for and stopped.

The binary and model are where tests/gateway/llama.py says (``LOCALMODEL_LLAMA_SERVER``,
``LOCALMODEL_GEMMA_GGUF``, by default under ~/.cache/localmodel-operator); this
one takes any thread count and a pre-exec hook (to start it inside a cgroup).
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.gateway.llama import BINARY, MODEL
from tests.harness.processes import ManagedProcess, free_ports, wait_until


class LlamaMissingError(RuntimeError):
    pass


@dataclass
class LlamaServer:
    url: str
    port: int
    process: ManagedProcess


def missing() -> list[str]:
    return [str(p) for p in (BINARY, MODEL) if not p.exists()]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def llama_server(
    log: Path,
    *,
    threads: int,
    context: int = 1024,
    slots: int = 1,
    extra: Sequence[str] = (),
    preexec: Callable[[], None] | None = None,
    timeout: float = 120.0,
) -> Iterator[LlamaServer]:
    """Start llama-server with exactly ``threads`` threads; stop it (by pid) afterwards.

    ``preexec`` runs in the child before exec (e.g. `Cgroup.join`)."""
    if missing():
        raise LlamaMissingError(
            "needs the real llama-server and Gemma 3 270M model, missing: "
            + ", ".join(missing()) + ". Build them with: bash hack/build-engines.sh"
        )
    [port] = free_ports(1)
    argv = [
        str(BINARY), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
        "-c", str(context * slots), "-np", str(slots), "-t", str(threads),
        "--metrics", "--no-warmup", *extra,
    ]
    process = ManagedProcess("llama-server", argv, log, preexec=preexec)
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("llama-server /health", lambda: _healthy(url), timeout, process.check_alive)
        yield LlamaServer(url, port, process)
    finally:
        process.stop()
