"""An engine adapter's doctor part (engines/adapter.py)."""

from __future__ import annotations

from typing import Protocol


class EngineDoctor(Protocol):
    """What doctor reads from a running engine."""
