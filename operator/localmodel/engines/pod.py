"""An engine adapter's pod part (engines/adapter.py)."""

from __future__ import annotations

from typing import Protocol


class EnginePod(Protocol):
    """Its containers, init steps, readiness and health."""
