"""llama.cpp's llama-server: image, binary, port and paths the operator relies on."""

from __future__ import annotations

# The pinned default image: ggml-org/llama.cpp's CPU server build
# (.devops/cpu.Dockerfile, target `server`: Ubuntu with curl, entrypoint
# BINARY, LLAMA_ARG_HOST=0.0.0.0). The tests run the llama.cpp tree vendored
# in PyPI's llama-cpp-python 0.3.36 (hack/build-engines.sh), which reports no
# build number (`--version`: build 1); the tag is the upstream build nearest
# to it as far as we can tell, not a verified match. Bumping it is a reviewed
# change; the flags rendered are checked against the tested build.
IMAGE = "ghcr.io/ggml-org/llama.cpp:server-b11316"
BINARY = "/app/llama-server"

# The server's port in the pod. llama-server's own default, 8080, is the
# gateway's; the operator always passes --port.
PORT = 8081
# 503 while the model loads, 200 once it serves (tools/server/README.md).
HEALTH_PATH = "/health"

# Where the weights volume is mounted and the GGUF file lives.
MODELS_DIR = "/models"

# What the init step needs from the image: a POSIX shell, curl (installed in
# the image's base stage) and coreutils' sha256sum.
SHELL = "/bin/sh"
