"""Every example against every node fixture renders the same objects and the
same digests as the committed golden files (tests/golden/render.py): a move
of the renderer or the engines that changed one byte of a pod would roll every
pod on upgrade."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localmodel.contract import ANNOTATION_POD_SPEC_HASH
from localmodel.podspec import WAKING_PROBES
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


PROBES = ("startupProbe", "readinessProbe")


def _probes_and_digests(model: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Take the startup and readiness probes and the pod digests out of a
    model's render (in place); the probes taken, by pod, container and kind."""
    model.pop("pod_hashes")
    taken = []
    for o in model["objects"]:
        if o["kind"] != "Pod":
            continue
        o["metadata"]["annotations"].pop(ANNOTATION_POD_SPEC_HASH)
        for c in o["spec"]["containers"]:
            taken += [(o["metadata"]["name"], f"{c['name']} {k}", c.pop(k)) for k in PROBES
                      if k in c]
    return taken


@pytest.mark.parametrize("stem", IDLE_CASES)
def test_a_model_with_idle_renders_as_without_but_probed_every_second(stem: str) -> None:
    """`spec.idle` changes one thing of a model's render: its pods' startup and
    readiness probes ask every second (a caller waits on a wake:
    podspec.probe_periods), each as patient with failures as before (the
    startup probe 30 min, readiness 15 s), so its pods' digests differ
    (setting idle rolls them once). Its other objects and the status of the
    pass are as without."""
    idle, plain = CASES[stem], CASES[stem.replace(IDLE_SUFFIX, "", 1)]
    assert [m["name"] for m in idle["models"]] == [m["name"] for m in plain["models"]]
    for a, b in zip(idle["models"], plain["models"], strict=True):
        a, b = json.loads(encode(a)), json.loads(encode(b))
        assert a["pod_hashes"].keys() == b["pod_hashes"].keys()
        assert all(a["pod_hashes"][k] != b["pod_hashes"][k] for k in a["pod_hashes"])
        fast, slow = _probes_and_digests(a), _probes_and_digests(b)
        assert a == b, (stem, a["name"])
        assert [w for w, _, _ in fast] == [w for w, _, _ in slow] and fast, (stem, fast)
        for (_, what, f), (_, _, s) in zip(fast, slow, strict=True):
            period = WAKING_PROBES.startup if "startup" in what else WAKING_PROBES.readiness
            assert f["periodSeconds"] == period < s["periodSeconds"], (stem, what)
            assert (f.get("failureThreshold", 3) * f["periodSeconds"]
                    == s.get("failureThreshold", 3) * s["periodSeconds"]), (stem, what)
            rest = {k: v for k, v in f.items() if k not in ("periodSeconds", "failureThreshold")}
            assert rest == {k: v for k, v in s.items()
                            if k not in ("periodSeconds", "failureThreshold")}


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
