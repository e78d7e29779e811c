"""Engine versions as the rules, the adapters and doctor compare them: the one
`Version` alias, and reading one from a version string or an image tag."""

from __future__ import annotations

import re

# An engine version, (major, minor, patch): compared as a tuple.
Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+].*)?$")


def parse_version(text: str | None) -> Version | None:
    """`0.32.2`, `v0.30.0-rc1` -> (0, 32, 2); anything else (`latest`) -> None."""
    if not text:
        return None
    m = _VERSION_RE.match(text.strip())
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def image_version(image: str) -> Version | None:
    """The version in an image tag: `ollama/ollama:0.32.2` -> (0, 32, 2)."""
    if "@" in image:  # pinned by digest: the tag (if any) may lie, trust nothing
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return parse_version(last.split(":", 1)[1])


def show_version(v: Version) -> str:
    return ".".join(str(p) for p in v)
