"""Every example against every node fixture renders the same objects and the
same digests as the committed golden files (tests/golden/render.py): a move
of the renderer or the engines that changed one byte of a pod would roll every
pod on upgrade."""

from __future__ import annotations

import json

import pytest

from tests.golden.render import OUT, cases, encode

pytestmark = pytest.mark.unit

CASES = dict(cases())


def test_every_golden_file_is_a_case_and_every_case_has_one() -> None:
    assert {p.stem for p in OUT.glob("*.json")} == set(CASES)


@pytest.mark.parametrize("stem", sorted(CASES))
def test_render_matches_golden(stem: str) -> None:
    want = json.loads((OUT / f"{stem}.json").read_text())
    got = json.loads(encode(CASES[stem]))
    assert got == want, (
        f"{stem}: the rendered objects or digests changed "
        "(python -m tests.golden.render --write regenerates: a reviewed change)"
    )


def test_golden_files_carry_pods_and_digests() -> None:
    pods = sum(
        1
        for value in CASES.values()
        for m in value["models"]
        for o in m["objects"]
        if o["kind"] == "Pod"
    )
    hashes = sum(len(m["pod_hashes"]) for v in CASES.values() for m in v["models"])
    assert pods > 50 and hashes == pods
