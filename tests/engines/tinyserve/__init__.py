"""tinyserve, a test-only engine: its facts (data, no imports), as a shipped
engine's `__init__.py` declares them (localmodel.engines.EngineFacts).

tinyserve is a stand-in the tests start (server.py here: deterministic text,
an invented account of the work), not a real engine. It speaks its own
dialect: one JSON config file its pod's init step writes, its own health
path, and its own account of a generation (`tiny_ledger`, in microseconds).
Everything about it lives in this folder: its adapter (adapter.py: pod.py,
tuning.py, doctor.py), its own rule (rules.py), its timing reader
(timing.py), its golden renders (golden/) and its tests. tests/conftest.py
registers it for the session (tests/engines/__init__.py)."""

from __future__ import annotations

# `spec.engine.name`, the gateway's --engine and doctor's kind.
NAME = "tinyserve"
TITLE = "tinyserve"
SUMMARY = "a test-only stand-in engine; serves the GGUF file named by `gguf`"
VERSION = "1.4.0"

# What the API allows with it: it serves a GGUF file (no registry), keeps its
# model loaded (no keepAlive), and has no AMX path (no safeCpuPath).
NEEDS_GGUF = True
KEEP_ALIVE = False
SAFE_CPU_PATH = False
AMX_LIBRARIES: tuple[str, ...] = ()

# No registry serves it: the image is a placeholder no pod in the tests pulls.
IMAGE = f"registry.invalid/localmodel-tests/tinyserve:{VERSION}"
PORT = 8300

# Its HTTP paths (server.py).
HEALTH_PATH = "/tiny/health"  # 503 {"state": "warming"}, then 200 {"state": "serving"}
STATE_PATH = "/tiny/state"  # what it serves and how (doctor reads it)
COMPLETIONS_PATH = "/v1/completions"
# Its own account of a generation, on an answer's last chunk (timing.py).
LEDGER_KEY = "tiny_ledger"
STOP_KEY = "stop_cause"

# Readiness (gateway/readiness.py): it loads its one model at start and its
# health path answers 200 once it serves.
SERVING_PATH = HEALTH_PATH
LOAD_PATH: str | None = None
# The gateway's calibration: OpenAI-compatible completions, with its own
# switch to write exactly max_tokens tokens.
CALIBRATION_PATH = COMPLETIONS_PATH
CALIBRATION_BODY: dict[str, object] = {"exact_length": True}
# Its "load": server.py warms for a moment and reads no weights.
LOAD_FIXED_SECONDS = 1.0
LOAD_SECONDS_PER_GIB = 0.0

# Its config file: the pod's init step writes it into CONFIG_DIR (an emptyDir
# volume), the server reads CONFIG_FILE; the weights volume is at MODELS_DIR.
CONFIG_DIR = "/etc/tinyserve"
CONFIG_FILE = f"{CONFIG_DIR}/config.json"
MODELS_DIR = "/models"
BINARY = "/usr/bin/tinyserve"
SHELL = "/bin/sh"

# It reads no variables of its own: nothing for the API to refuse in spec.env.
MANAGED_ENV: tuple[str, ...] = ()
