"""Ollama: its name, pinned version, port, paths, images, libraries and the
environment the operator sets, as the operator relies on them."""

from __future__ import annotations

# `spec.engine.name` (the API's EngineName), the gateway's --engine and doctor's kind.
NAME = "ollama"
# Where the API lists it among the shipped engines (spec.engine.name's enum);
# the first listed is the default engine (localmodel.engines.DEFAULT).
ORDER = 0
# How prose names it, and what it does with `spec.model` and `spec.gguf` (the
# API's description of spec.engine.name).
TITLE = "Ollama"
SUMMARY = "pulls `model` from Ollama's registry, or imports the GGUF file named by `gguf`"

# What the API allows with this engine (api/rules.py refuses, per engine, each
# spec field the engine has no use for):
NEEDS_GGUF = False  # it pulls `model` from its registry, or imports spec.gguf
KEEP_ALIVE = True  # spec.keepAlive becomes OLLAMA_KEEP_ALIVE

# The pinned version: the newest release the Go module proxy serves (v0.34.4,
# 2026-09-23), which the AMX rules treat as fixed (>= 0.32.2, ollama#17244)
# and which the engine tests build and run (hack/build-engines.sh builds
# exactly this version by default, read by build.sh beside this file;
# tests/architecture/test_engine_home.py checks it).
VERSION = "0.34.4"
# The pinned default image: the official image of VERSION.
IMAGE = f"docker.io/ollama/ollama:{VERSION}"

# The server's port (ollama envconfig OLLAMA_HOST default).
PORT = 11434
# Where its own clients (and doctor --local) find it (ollama envconfig).
HOST_ENV: str | None = "OLLAMA_HOST"
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

# How the gateway (gateway/readiness.py) tells that the model serves: the
# loaded models, and while ours is not among them it loads it itself with the
# pod's settings (a generation with no prompt) so that the first caller does
# not pay for the load (see localmodel.engines.EngineFacts).
SERVING_PATH = PS_PATH
LOAD_PATH: str | None = GENERATE_PATH
# The gateway's speed calibration (gateway/speed.py): Ollama's own generate
# API, which takes the pod's runner options and keep_alive; raw: the prompt
# as written, no chat template. Ollama has no ignore_eos, so the prompt is one
# every model keeps writing.
CALIBRATION_PATH = GENERATE_PATH
CALIBRATION_BODY: dict[str, object] = {"raw": True}

# Its load with the GGUF file in the page cache (EngineFacts), from the
# gateway's load request to the model loaded (its llama-server child reads the
# file into memory, `--load-mode none` on CPU, and repacks it), measured at
# one thread on the synthetic real-shape models:
# docs/benchmarks.md#start-time-at-real-sizes-benchmarksstartpy. Not a line
# (8B: 3.5 s/GiB, 4B: 2.3): the fit's slope, 3.4 s/GiB, above the 270M's
# whole warm load, 1.3 s, bounds every measured load from above.
LOAD_FIXED_SECONDS = 1.3
LOAD_SECONDS_PER_GIB = 3.4

# Set, the server does not prune blobs no manifest names at start (ollama
# envconfig/config.go, server/routes.go).
NOPRUNE = "OLLAMA_NOPRUNE"

# The server's home in the official image (runs as root): the weights volume
# is mounted here, and OLLAMA_MODELS points below it.
HOME = "/root/.ollama"
MODELS_DIR = f"{HOME}/models"

# The CPU variant that crashes on AMX hosts in 0.30.0-0.32.1 (ollama#17205).
AMX_LIBRARY = "/usr/lib/ollama/libggml-cpu-sapphirerapids.so"
# AMX is this engine's concern, decided here once (localmodel.engines.EngineFacts):
# the API allows placement.safeCpuPath, its rules guard AMX hosts (rules.py), doctor
# looks for the crash (tests/architecture/test_facts_once.py checks each follows).
AMX_LIBRARIES: tuple[str, ...] = (AMX_LIBRARY,)
# The versions the AMX rules tell apart (docs/engine-facts.md#amx):
AMX_FIXED_IN = (0, 32, 2)  # ollama#17244 (GCC 13 build)
AMX_VARIANT_BACK = (0, 30, 0)  # the sapphirerapids CPU variant ships again from v0.30
# OLLAMA_LLM_LIBRARY chooses a CPU runner (cpu_avx2) only before v0.5.12; from
# then on it filters GPU library folders only (docs/engine-facts.md#ollama_llm_library).
CPU_RUNNERS_UNTIL = (0, 5, 12)

# Ollama passes its llama-server child no --cache-ram but its whole environment,
# so llama.cpp's variable for it bounds the child's host-memory prompt cache
# (ollama llm/llama_server.go; docs/engine-facts.md#the-prompt-cache-in-host-memory).
PROMPT_CACHE_ENV = "LLAMA_ARG_CACHE_RAM"
# And so llama.cpp's variable for --ctx-checkpoints bounds its context checkpoints
# (llama.cpp common/arg.cpp; docs/engine-facts.md#context-checkpoints).
CHECKPOINTS_ENV = "LLAMA_ARG_CTX_CHECKPOINTS"

# Environment variables the operator's rules set for Ollama (ollama
# envconfig/config.go; GOMAXPROCS is Go's). A user setting one would silently
# undo a rule, so the API refuses them in spec.env. Exactly the variables the
# rules can set: tests/architecture/test_engine_home.py renders every engine path and
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
    PROMPT_CACHE_ENV,
    CHECKPOINTS_ENV,
)
