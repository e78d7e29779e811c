"""llama_server's adapter, doctor part (engines/doctor.py)."""

from __future__ import annotations


class LlamaServerDoctor:
    """llama_server: what doctor reads from a running engine."""
