"""ollama's adapter, tuning part (engines/tuning.py)."""

from __future__ import annotations


class OllamaTuning:
    """ollama: how the rules' decisions are spelled for it."""
