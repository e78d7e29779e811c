"""llama_server's adapter, pod part (engines/pod.py)."""

from __future__ import annotations


class LlamaServerPod:
    """llama_server: its containers, init steps, readiness and health."""
