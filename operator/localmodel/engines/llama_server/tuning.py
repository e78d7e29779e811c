"""llama_server's adapter, tuning part (engines/tuning.py)."""

from __future__ import annotations


class LlamaServerTuning:
    """llama_server: how the rules' decisions are spelled for it."""
