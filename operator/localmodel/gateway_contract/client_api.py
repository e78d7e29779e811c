"""The API callers speak to a model, whatever engine serves it: Ollama's API
(docs.ollama.com/api) as the Service, the gateway and the router answer it.
Pure data; names no engine.

Callers keep Ollama's port and paths (a client written for Ollama works
unchanged): the Service listens on `SERVICE_PORT` and targets the gateway,
which serves these paths beside the OpenAI-compatible ones (gateway/routes.py)
and relays them to the engine behind it; the router serves them for every
namespace. These are facts of the callers' API, not of an engine: what the
Ollama *engine* serves in the pod (its own port and paths, which doctor and
the gateway's readiness call) is in its package (engines/ollama/) and may
change without these changing.
"""

from __future__ import annotations

SERVICE_PORT = 11434  # the port callers keep (Ollama's default, OLLAMA_HOST's)

GENERATE_PATH = "/api/generate"  # a generation from a prompt
CHAT_PATH = "/api/chat"  # a generation from messages
EMBED_PATH = "/api/embed"  # embeddings
TAGS_PATH = "/api/tags"  # the models served
SHOW_PATH = "/api/show"  # a model's details
PS_PATH = "/api/ps"  # the models loaded
VERSION_PATH = "/api/version"  # the server's version
