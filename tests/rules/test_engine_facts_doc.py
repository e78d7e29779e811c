"""docs/engine-facts.md and the rules' sources hold together: every rule's
source is made of citations that resolve (project documents and their
sections, API fields; upstream files are checked against the built engines'
sources in tests/engines/test_sources.py), no source points outside the
repository, and every fact in the page names its sources and either a test
that exists or why it cannot be tested here."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.rules.table import SHIPPED_RULES
from tests.citations import ROOT, Citation, anchors, citations

pytestmark = pytest.mark.unit

DOC = ROOT / "docs" / "engine-facts.md"
CRD = ROOT / "crds" / "localmodel.dev_localmodels.yaml"


def sections() -> dict[str, str]:
    """### heading -> its body, for the page's facts."""
    out: dict[str, str] = {}
    current = None
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            out[current] = ""
        elif line.startswith("## "):
            current = None
        elif current is not None:
            out[current] += line + "\n"
    return out


def field_exists(path: str) -> bool:
    crd = yaml.safe_load(CRD.read_text())
    schema: Any = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path.split("."):
        props = schema.get("properties", {})
        if part not in props:
            return False
        schema = props[part]
    return True


def resolves(c: Citation) -> bool:
    if c.kind == "doc":
        target = ROOT / c.path
        return target.is_file() and c.anchor in anchors(target.read_text())
    if c.kind == "field":
        return field_exists(c.path)
    return c.kind in ("issue", "file")  # upstream: see tests/engines/test_sources.py


@pytest.mark.parametrize("rule", SHIPPED_RULES, ids=lambda r: r.id)
def test_every_rule_source_resolves(rule: Any) -> None:
    cited = citations(rule.source)  # raises on anything that is not a citation
    assert cited
    for c in cited:
        assert resolves(c), f"{rule.id}: {c.text} does not resolve"
    assert "ENGINE-FACTS" not in rule.source and "PRODUCT" not in rule.source
    assert "/work" not in rule.source


def test_every_rule_cites_a_primary_source_or_the_engine_facts_page() -> None:
    for rule in SHIPPED_RULES:
        kinds = {c.kind for c in citations(rule.source)}
        docs = {c.path for c in citations(rule.source) if c.kind == "doc"}
        assert kinds & {"issue", "file"} or "docs/engine-facts.md" in docs, rule.id


def test_the_resolver_rejects_what_does_not_exist() -> None:
    assert not resolves(citations("docs/engine-facts.md#no-such-fact")[0])
    assert not resolves(citations("docs/nothing.md#amx")[0])
    assert not resolves(citations("spec.placement.noSuchField")[0])
    assert resolves(citations("spec.placement.safeCpuPath")[0])
    for bad in ["ENGINE-FACTS.md Threads", "PRODUCT.md problem 3", "/work/shared/docs/x.md#a"]:
        with pytest.raises(ValueError):
            citations(bad)


def _tests_named(text: str) -> list[tuple[str, str]]:
    return re.findall(r"`(tests/[\w/.-]+\.py)::(test_\w+)`", text)


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


@pytest.mark.parametrize("heading", sorted(sections()))
def test_every_fact_names_sources_and_a_test_or_why_not(heading: str) -> None:
    body = sections()[heading]
    assert "\nSources:" in "\n" + body, f"{heading}: no Sources line"
    sources = body.split("Sources:", 1)[1].split("Test:", 1)[0]
    cited = [part.strip().strip("`").rstrip(".").strip("`") for part in sources.split(";")]
    for c in citations("; ".join(" ".join(part.split()) for part in cited)):
        assert resolves(c), f"{heading}: {c.text}"
    assert "\nTest:" in "\n" + body, f"{heading}: no Test line"
    test_text = body.split("Test:", 1)[1]
    named = _tests_named(test_text)
    if not test_text.strip().startswith("not testable here"):
        assert named, f"{heading}: Test names no test and does not say why not"
    for path, name in named:
        assert (ROOT / path).is_file(), f"{heading}: {path} missing"
        assert _defines(ROOT / path, name), f"{heading}: {path} has no {name}"


def test_every_docs_citation_in_the_page_resolves() -> None:
    text = DOC.read_text()
    for target in re.findall(r"\]\(#([\w-]+)\)", text):
        assert target in anchors(text), target
