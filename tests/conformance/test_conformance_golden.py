"""Golden render, for every engine: a shipped engine's pods are among the
committed goldens (tests/golden/render/, which tests/render/test_render_golden.py
compares byte for byte); a test-only engine keeps its own in its folder
(tests/conformance/golden.py), and its models render exactly those objects
and digests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localmodel.contract import CONTAINER_GATEWAY
from localmodel.gateway_contract import env_name
from tests.conformance.golden import cases, golden_dir
from tests.conformance.subjects import NAMES, is_test_only
from tests.golden.render import OUT, encode

pytestmark = pytest.mark.unit


def _engines_in(value: dict[str, Any]) -> set[str]:
    """The engines a golden file's pods run (as their gateways are told)."""
    found = set()
    for model in value["models"]:
        for obj in model["objects"]:
            if obj["kind"] != "Pod":
                continue
            for container in obj["spec"]["containers"]:
                if container["name"] == CONTAINER_GATEWAY:
                    env = {e["name"]: e.get("value") for e in container.get("env", [])}
                    found.add(env[env_name("engine")])
    return found


@pytest.mark.parametrize("name", NAMES)
def test_every_engine_has_golden_renders_of_its_pods(name: str) -> None:
    if is_test_only(name):
        _renders_its_own_goldens(name)
        files = sorted(golden_dir(name).glob("*.json"))
    else:
        files = sorted(OUT.glob("*.json"))
    assert any(name in _engines_in(json.loads(p.read_text())) for p in files), (
        f"no golden render holds a pod of {name}")


def _renders_its_own_goldens(name: str) -> None:
    got = dict(cases(name))
    kept = {p.stem: p for p in golden_dir(name).glob("*.json")}
    assert set(got) == set(kept) and got, (
        f"python -m tests.conformance.golden --write {name} regenerates (a reviewed change)")
    for stem, value in got.items():
        assert json.loads(encode(value)) == json.loads(kept[stem].read_text()), stem
