"""llama.cpp's llama-server: reserved in the API, not rendered yet."""

from __future__ import annotations

# The default image (the server build of ggml-org/llama.cpp).
IMAGE = "ghcr.io/ggml-org/llama.cpp:server"
