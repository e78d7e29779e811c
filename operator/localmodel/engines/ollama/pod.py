"""ollama's adapter, pod part (engines/pod.py)."""

from __future__ import annotations


class OllamaPod:
    """ollama: its containers, init steps, readiness and health."""
