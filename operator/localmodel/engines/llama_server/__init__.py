"""llama.cpp's llama-server: its name, image, tested build, binary, port,
paths, the flags the operator renders and the variables that shadow them."""

from __future__ import annotations

# `spec.engine.name` (the API's EngineName), the gateway's --engine and doctor's kind.
NAME = "llama-server"
ORDER = 1  # where the API lists it among the shipped engines (spec.engine.name's enum)
# How prose names it, and what it does with `spec.model` and `spec.gguf` (the
# API's description of spec.engine.name).
TITLE = NAME
SUMMARY = "llama.cpp's server; serves the GGUF file named by `gguf`"

# What the API allows with this engine (api/rules.py refuses, per engine, each
# spec field the engine has no use for):
NEEDS_GGUF = True  # it serves a GGUF file and has no registry to pull from
KEEP_ALIVE = False  # it always keeps its model loaded
AMX_LIBRARIES: tuple[str, ...] = ()  # no build of it is known to crash on AMX hosts

# The pinned default image: ggml-org/llama.cpp's CPU server build
# (.devops/cpu.Dockerfile, target `server`: Ubuntu with curl, entrypoint
# BINARY, LLAMA_ARG_HOST=0.0.0.0). The tests run the llama.cpp tree vendored
# in PyPI's llama-cpp-python TESTED_VERSION (hack/build-engines.sh builds
# exactly it by default, read by build.sh beside this file;
# tests/architecture/test_engine_home.py checks it), which
# reports no build number (`--version`: build 1); BUILD is the upstream build
# nearest to it as far as we can tell, not a verified match. Bumping either is
# a reviewed change; the flags rendered are checked against the tested build.
BUILD = "b11316"
IMAGE = f"ghcr.io/ggml-org/llama.cpp:server-{BUILD}"
TESTED_SOURCE = "llama-cpp-python"
TESTED_VERSION = "0.3.36"
BINARY = "/app/llama-server"

# The server's port in the pod. llama-server's own default, 8080, is the
# gateway's; the operator always passes --port.
PORT = 8081
# It has no client variable for its address (LLAMA_ARG_HOST is the server's own).
HOST_ENV: str | None = None

# HTTP paths the operator, the gateway and doctor call (tools/server/README.md).
HEALTH_PATH = "/health"  # 503 while the model loads, 200 once it serves
# While the model loads every path answers this status (the server listens
# first, then loads: tools/server/server.cpp), with {"error": {"message":
# "Loading model", ...}}. A load under oversubscribed threads takes minutes.
LOADING_STATUS = 503
PROPS_PATH = "/props"  # slots, context and build; reports no thread count
SLOTS_PATH = "/slots"  # per-slot state, prompts included (off with --no-slots)
METRICS_PATH = "/metrics"  # Prometheus counters, with --metrics
COMPLETIONS_PATH = "/v1/completions"  # OpenAI-compatible completions

# How the gateway (gateway/readiness.py) tells that the model serves: the
# server loads its one model at start and its health path answers 200 once
# it serves (LOADING_STATUS before), so there is nothing to load.
SERVING_PATH = HEALTH_PATH
LOAD_PATH: str | None = None
# The gateway's speed calibration (gateway/speed.py): OpenAI-compatible
# completions with the server's own extensions: ignore_eos (so it always
# decodes the asked number of tokens) and no prompt cache reuse.
CALIBRATION_PATH = COMPLETIONS_PATH
CALIBRATION_BODY: dict[str, object] = {"ignore_eos": True, "cache_prompt": False}

# Its load with the GGUF file in the page cache (EngineFacts): the intercept
# and the slope of load time over the file's GiB (on AVX2 the slope is mostly
# the Q4_K repack at load), measured at one thread on the synthetic real-shape
# models: docs/benchmarks.md#start-time-at-real-sizes-benchmarksstartpy.
LOAD_FIXED_SECONDS = 1.0  # the fit's intercept: 1.00 s
LOAD_SECONDS_PER_GIB = 0.8  # its slope: 0.81 s/GiB (270M to Qwen3 8B)

# Where the weights volume is mounted and the GGUF file lives.
MODELS_DIR = "/models"

# What the init step needs from the image: a POSIX shell, curl (installed in
# the image's base stage) and coreutils' sha256sum.
SHELL = "/bin/sh"

# Every flag the operator's rules render, with the environment variable
# llama-server reads for it (names as `llama-server --help` lists them, checked
# against the built one by tests/engines/test_llama_server_flags.py; -tb has
# none). llama-server reads LLAMA_ARG_* first and its flags second (llama.cpp
# common/arg.cpp), so a user variable would be silently overridden by the flag:
# the API refuses it rather than ignore it.
FLAG_ENV: dict[str, str | None] = {
    "-m": "LLAMA_ARG_MODEL",
    "--alias": "LLAMA_ARG_ALIAS",
    "--host": "LLAMA_ARG_HOST",
    "--port": "LLAMA_ARG_PORT",
    "-t": "LLAMA_ARG_THREADS",
    "-tb": None,
    "-c": "LLAMA_ARG_CTX_SIZE",
    "-np": "LLAMA_ARG_N_PARALLEL",
    "-ctk": "LLAMA_ARG_CACHE_TYPE_K",
    "-ctv": "LLAMA_ARG_CACHE_TYPE_V",
    "-fa": "LLAMA_ARG_FLASH_ATTN",
    "--metrics": "LLAMA_ARG_ENDPOINT_METRICS",
    "--cache-ram": "LLAMA_ARG_CACHE_RAM",
    "--ctx-checkpoints": "LLAMA_ARG_CTX_CHECKPOINTS",
    "--no-slots": "LLAMA_ARG_ENDPOINT_SLOTS",
    "--no-webui": "LLAMA_ARG_UI",
}
# How a command line says threads, context and model, in all forms llama-server
# takes (short, long; doctor reads any llama-server's, not only ours).
THREADS_FLAGS = ("-t", "--threads")
THREADS_ENV = "LLAMA_ARG_THREADS"
CONTEXT_FLAGS = ("-c", "--ctx-size")
MODEL_FLAGS = ("-m", "--model", "-hf", "--hf-repo")

# The variables the API refuses in spec.env for llama-server's sake.
MANAGED_ENV: tuple[str, ...] = tuple(v for v in FLAG_ENV.values() if v is not None)
