"""ollama's adapter, doctor part (engines/doctor.py)."""

from __future__ import annotations


class OllamaDoctor:
    """ollama: what doctor reads from a running engine."""
