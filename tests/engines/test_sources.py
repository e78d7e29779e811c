"""Every upstream file a rule or docs/engine-facts.md cites exists in the
sources of that engine: Ollama's module at the cited version (the version we
build when none is cited) from the Go module proxy, llama.cpp's tree from the
sdist the build uses. A renamed or removed upstream file fails here."""

from __future__ import annotations

import functools
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from localmodel.rules.table import SHIPPED_RULES
from tests.citations import Citation, citations
from tests.harness.engines import ollama_version, path, require
from tests.rules.test_engine_facts_doc import sections

pytestmark = pytest.mark.engine


def cited_files() -> list[Citation]:
    found: dict[str, Citation] = {}
    for rule in SHIPPED_RULES:  # the shipped engines: a test-only engine cites no upstream
        for c in citations(rule.source):
            found.setdefault(c.text, c)
    for body in sections().values():
        text = body.split("Sources:", 1)[1].split("Test:", 1)[0]
        parts = [
            " ".join(p.split()).strip().strip("`").rstrip(".").strip("`") for p in text.split(";")
        ]
        for c in citations("; ".join(parts)):
            found.setdefault(c.text, c)
    return sorted((c for c in found.values() if c.kind == "file"), key=lambda c: c.text)


@functools.cache
def ollama_module(version: str) -> Path:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"github.com/ollama/ollama@{version}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return Path(json.loads(out.stdout)["Dir"])


@functools.cache
def llama_cpp_files() -> frozenset[str]:
    require("ollama")  # the build that downloaded the sdist
    sdist = path("llama.cpp-source")
    assert sdist.is_file(), f"{sdist} missing: run bash hack/build-engines.sh"
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    return frozenset(n.split("/llama.cpp/", 1)[1] for n in names if "/llama.cpp/" in n)


def test_some_upstream_files_are_cited() -> None:
    repos = {c.repo for c in cited_files()}
    assert repos == {"ollama", "llama.cpp"}


@pytest.mark.parametrize("cited", cited_files(), ids=lambda c: c.text)
def test_cited_upstream_file_exists(cited: Citation) -> None:
    if cited.repo == "ollama":
        version = cited.version or f"v{ollama_version()}"
        assert (ollama_module(version) / cited.path).is_file(), f"{cited.text} not in {version}"
    else:
        assert cited.path in llama_cpp_files(), f"{cited.text} not in the llama.cpp tree"
