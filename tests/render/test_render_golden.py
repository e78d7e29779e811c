"""Every example against every node fixture renders the same objects and the
same digests as the committed golden files (tests/golden/render.py): a move
of the renderer or the engines that changed one byte of a pod would roll every
pod on upgrade."""

from __future__ import annotations

import json

import pytest

from tests.golden.render import IDLE_SUFFIX, OUT, ROUTER_URL, cases, encode

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


IDLE_CASES = sorted(stem for stem in CASES if IDLE_SUFFIX + "--" in stem)


def test_there_are_idle_cases() -> None:
    assert len(IDLE_CASES) >= 4


@pytest.mark.parametrize("stem", IDLE_CASES)
def test_a_model_with_idle_renders_exactly_as_without(stem: str) -> None:
    """`spec.idle` changes nothing a model's render holds: its objects, their
    digests (no pod rolls when a model sets idle) and the status of the pass."""
    idle, plain = CASES[stem], CASES[stem.replace(IDLE_SUFFIX, "", 1)]
    assert [m["name"] for m in idle["models"]] == [m["name"] for m in plain["models"]]
    for a, b in zip(idle["models"], plain["models"], strict=True):
        assert json.loads(encode(a)) == json.loads(encode(b)), (stem, a["name"])


@pytest.mark.parametrize("stem", IDLE_CASES)
def test_each_idle_model_has_one_doorman_naming_the_router_only_when_given(stem: str) -> None:
    doormen = CASES[stem]["doormen"]
    assert set(doormen) == {m["name"] for m in CASES[stem]["models"]}
    for name, pods in doormen.items():
        [plain], [routed] = pods["no router"], pods["router"]
        assert plain["metadata"]["name"] == routed["metadata"]["name"] == f"{name}-doorman"
        assert ROUTER_URL not in json.dumps(plain) and ROUTER_URL in json.dumps(routed)
        # Not one of the model's rendered objects: the operator makes it at a release.
        objects = {o["metadata"]["name"] for m in CASES[stem]["models"] for o in m["objects"]}
        assert f"{name}-doorman" not in objects
