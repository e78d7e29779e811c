"""The grammar of a rule's `source` and of docs/engine-facts.md's Sources lines.

A source is citations separated by "; ", each one of:
  `ollama#17205`                      an upstream issue or pull request
  `ollama envconfig/config.go`        an upstream file (at the version we build)
  `ollama@v0.24.0 llm/server.go`      an upstream file at a given version
  `llama.cpp common/arg.cpp (-t)`     either, with a note on what to look for
  `docs/engine-facts.md#amx`          a section of a project document
  `spec.placement.safeCpuPath`        a field of the LocalModel API
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPOS = ("ollama", "llama.cpp", "kubernetes")

_ISSUE = re.compile(r"^(?P<repo>ollama|llama\.cpp|kubernetes)#(?P<number>\d+)$")
_FILE = re.compile(
    r"^(?P<repo>ollama|llama\.cpp)(?:@(?P<version>v\d+\.\d+\.\d+))? (?P<path>[\w./-]+\.\w+)"
    r"(?: \([^()]+\))?$"
)
_DOC = re.compile(r"^(?P<path>docs/[\w.-]+\.md)#(?P<anchor>[\w-]+)$")
_FIELD = re.compile(r"^spec(?:\.[a-zA-Z]\w*)+$")


@dataclass(frozen=True)
class Citation:
    kind: str  # issue, file, doc, field
    text: str
    repo: str = ""
    version: str = ""
    path: str = ""
    anchor: str = ""


def parse(text: str) -> Citation:
    if m := _ISSUE.match(text):
        return Citation("issue", text, repo=m["repo"])
    if m := _FILE.match(text):
        return Citation("file", text, repo=m["repo"], version=m["version"] or "", path=m["path"])
    if m := _DOC.match(text):
        return Citation("doc", text, path=m["path"], anchor=m["anchor"])
    if _FIELD.match(text):
        return Citation("field", text, path=text)
    raise ValueError(f"not a citation: {text!r}")


def citations(source: str) -> list[Citation]:
    return [parse(part.strip()) for part in source.split(";")]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"^#{1,6} (.+)$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out
