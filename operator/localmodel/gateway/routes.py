"""The routes the gateway serves and what each one is. Pure data. (The
callers' Ollama API paths are gateway_contract/client_api.py's.)"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from localmodel.gateway_contract import client_api


class Kind(StrEnum):
    """What a route carries: the API and the shape of its answer."""

    GENERATE = "generate"  # Ollama /api/generate: NDJSON, `response`
    CHAT = "chat"  # Ollama /api/chat: NDJSON, `message`
    EMBED = "embed"  # Ollama /api/embed: one JSON object
    OPENAI_CHAT = "openai_chat"  # /v1/chat/completions: SSE chat.completion.chunk
    OPENAI_COMPLETION = "openai_completion"  # /v1/completions: SSE text_completion
    OPENAI_EMBED = "openai_embed"  # /v1/embeddings: one JSON object
    PASSTHROUGH = "passthrough"  # metadata: no slot, relayed as is


@dataclass(frozen=True)
class Route:
    """One path the gateway serves: its methods and kind."""

    path: str
    methods: tuple[str, ...]
    kind: Kind

    @property
    def uses_slot(self) -> bool:
        """Work that occupies the engine waits for a slot; metadata calls do not."""
        return self.kind is not Kind.PASSTHROUGH

    @property
    def reads_body(self) -> bool:
        """A POST's body is admitted like work (a place held before it is
        read, the bounds once parsed), metadata (/api/show) included."""
        return "POST" in self.methods

    @property
    def streams(self) -> bool:
        """Generation: always streamed upstream, assembled for non-streaming callers."""
        return self.kind in (Kind.GENERATE, Kind.CHAT, Kind.OPENAI_CHAT, Kind.OPENAI_COMPLETION)

    @property
    def is_openai(self) -> bool:
        return self.kind in (Kind.OPENAI_CHAT, Kind.OPENAI_COMPLETION, Kind.OPENAI_EMBED)

    @property
    def is_ollama_native(self) -> bool:
        return self.kind in (Kind.GENERATE, Kind.CHAT, Kind.EMBED)


ROUTES: tuple[Route, ...] = (
    Route(client_api.GENERATE_PATH, ("POST",), Kind.GENERATE),
    Route(client_api.CHAT_PATH, ("POST",), Kind.CHAT),
    Route(client_api.EMBED_PATH, ("POST",), Kind.EMBED),
    Route(client_api.TAGS_PATH, ("GET",), Kind.PASSTHROUGH),
    Route(client_api.SHOW_PATH, ("POST",), Kind.PASSTHROUGH),
    Route(client_api.PS_PATH, ("GET",), Kind.PASSTHROUGH),
    Route(client_api.VERSION_PATH, ("GET",), Kind.PASSTHROUGH),
    Route("/v1/chat/completions", ("POST",), Kind.OPENAI_CHAT),
    Route("/v1/completions", ("POST",), Kind.OPENAI_COMPLETION),
    Route("/v1/embeddings", ("POST",), Kind.OPENAI_EMBED),
    Route("/v1/models", ("GET",), Kind.PASSTHROUGH),
)
# Where the gateway's own errors take OpenAI's shape.
OPENAI_PATHS = frozenset(route.path for route in ROUTES if route.is_openai)
