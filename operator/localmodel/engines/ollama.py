"""Ollama: ports, paths, images and libraries the operator relies on."""

from __future__ import annotations

# The pinned default image: the newest release the Go module proxy serves
# (v0.34.4, 2026-09-23), which the AMX rules treat as fixed (>= 0.32.2, ollama#17244)
# and which the engine tests build and run (hack/build-engines.sh).
IMAGE = "docker.io/ollama/ollama:0.34.4"

# The server's port (ollama envconfig OLLAMA_HOST default).
PORT = 11434
# The binary in the official image, and its server subcommand.
BINARY = "/bin/ollama"
SERVE = "serve"
# An HTTP endpoint that answers once the server is up.
HEALTH_PATH = "/api/version"

# The server's home in the official image (runs as root): the weights volume
# is mounted here, and OLLAMA_MODELS points below it.
HOME = "/root/.ollama"
MODELS_DIR = f"{HOME}/models"

# The CPU variant that crashes on AMX hosts in 0.30.0-0.32.1 (ollama#17205).
AMX_LIBRARY = "/usr/lib/ollama/libggml-cpu-sapphirerapids.so"
