"""Ollama: ports, paths, images and libraries the operator relies on."""

from __future__ import annotations

# The pinned default image. v0.32.2 carries the fix for the AMX
# (sapphirerapids) crash (ollama PR #17244).
IMAGE = "docker.io/ollama/ollama:0.32.2"

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
