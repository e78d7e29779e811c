"""An engine adapter's tuning part (engines/adapter.py)."""

from __future__ import annotations

from typing import Protocol


class EngineTuning(Protocol):
    """How the rules' decisions are spelled for this engine."""
