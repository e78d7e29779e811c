"""A machine's files, read under a root: ``/``, ``/host`` in the probe's pod, or a
fake ``/proc`` and ``/sys`` tree in tests. A file that is not there reads as
``None``; content that cannot be understood is a `MachineFactsError` naming the
file."""

from __future__ import annotations

from pathlib import Path


class MachineFactsError(ValueError):
    """A system file under root has content we cannot read; names the file."""


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is missing or cannot be opened."""
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None
