"""Ollama: its name, pinned version, port, paths, images, libraries and the
environment the operator sets, as the operator relies on them."""

from __future__ import annotations

# `spec.engine.name` (the API's EngineName), the gateway's --engine and doctor's kind.
NAME = "ollama"

# The pinned version: the newest release the Go module proxy serves (v0.34.4,
# 2026-09-23), which the AMX rules treat as fixed (>= 0.32.2, ollama#17244)
# and which the engine tests build and run (hack/build-engines.sh builds
# exactly this version by default; tests/unit/test_engine_home.py checks it).
VERSION = "0.34.4"
# The pinned default image: the official image of VERSION.
IMAGE = f"docker.io/ollama/ollama:{VERSION}"

# The server's port (ollama envconfig OLLAMA_HOST default).
PORT = 11434
# The binary in the official image, and its server subcommand.
BINARY = "/bin/ollama"
SERVE = "serve"
# The image's POSIX shell, for the init step and the library removal at start.
SHELL = "/bin/sh"

# HTTP API paths the operator, the gateway and doctor call (ollama docs/api.md).
VERSION_PATH = "/api/version"  # {"version": "0.34.4"}; answers once the server is up
PS_PATH = "/api/ps"  # the loaded models
SHOW_PATH = "/api/show"  # a model's Modelfile parameters
TAGS_PATH = "/api/tags"  # the models on disk
GENERATE_PATH = "/api/generate"  # a generation; with no prompt, loads the model
# An HTTP endpoint that answers once the server is up.
HEALTH_PATH = VERSION_PATH

# Set, the server does not prune blobs no manifest names at start (ollama
# envconfig/config.go, server/routes.go).
NOPRUNE = "OLLAMA_NOPRUNE"

# The server's home in the official image (runs as root): the weights volume
# is mounted here, and OLLAMA_MODELS points below it.
HOME = "/root/.ollama"
MODELS_DIR = f"{HOME}/models"

# The CPU variant that crashes on AMX hosts in 0.30.0-0.32.1 (ollama#17205).
AMX_LIBRARY = "/usr/lib/ollama/libggml-cpu-sapphirerapids.so"
# The versions the AMX rules tell apart (docs/engine-facts.md#amx):
AMX_FIXED_IN = (0, 32, 2)  # ollama#17244 (GCC 13 build)
AMX_VARIANT_BACK = (0, 30, 0)  # the sapphirerapids CPU variant ships again from v0.30
# OLLAMA_LLM_LIBRARY chooses a CPU runner (cpu_avx2) only before v0.5.12; from
# then on it filters GPU library folders only (docs/engine-facts.md#ollama_llm_library).
CPU_RUNNERS_UNTIL = (0, 5, 12)

# Environment variables the operator's rules set for Ollama (ollama
# envconfig/config.go; GOMAXPROCS is Go's). A user setting one would silently
# undo a rule, so the API refuses them in spec.env. Exactly the variables the
# rules can set: tests/unit/test_engine_home.py renders every engine path and
# compares.
MANAGED_ENV: tuple[str, ...] = (
    "OLLAMA_HOST",
    "OLLAMA_MODELS",
    "OLLAMA_KEEP_ALIVE",
    "OLLAMA_NUM_PARALLEL",
    "OLLAMA_MAX_LOADED_MODELS",
    "OLLAMA_CONTEXT_LENGTH",
    "OLLAMA_FLASH_ATTENTION",
    "OLLAMA_KV_CACHE_TYPE",
    "OLLAMA_LLM_LIBRARY",
    "GOMAXPROCS",
)
