"""The kstatus pair (Reconciling, Stalled) the operator derives from its own
conditions, so kstatus (Flux) and the Argo CD check (docs/gitops/) read a
LocalModel right: a table of every state the operator reports, a model asleep or waking
(spec.idle) included."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.api import ConditionStatus, LocalModel, LocalModelStatus
from localmodel.desired import desired_state
from localmodel.status import invalid_status, with_progress
from tests.builders import MakeLocalModel, MakeNode
from tests.gitops.idle_cases import idle_model

pytestmark = pytest.mark.unit

NOW = "2026-12-01T00:00:00Z"
LATER = "2026-12-01T01:00:00Z"
NODE = MakeNode("n0").cpu_flags({"AVX2"}).facts()
MODEL = MakeLocalModel("m").uid("u1").generation(3).cpu(4)


def status(model: LocalModel, ready: dict[int, bool] | None, rolling: str | None = None,
           now: str = NOW) -> LocalModelStatus:
    [r] = desired_state([model], [NODE], now=now,
                        ready=None if ready is None else {model.key: ready}).models
    return with_progress(r.status, rolling, model, now) if not r.problems else r.status


def pair(s: LocalModelStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in s.conditions
            if c.type in ("Reconciling", "Stalled")}


@pytest.mark.parametrize(("name", "spec", "ready", "rolling", "want"), [
    ("at rest: neither", {}, {0: True}, None, {}),
    ("pods starting", {}, {0: False}, None, {"Reconciling": ("True", "ReplicasNotReady")}),
    ("a roll under way", {}, {0: True}, "replica 0: replacing",
     {"Reconciling": ("True", "RollingUpdate")}),
    ("no node is big enough", {"cpu": 64}, {}, None, {"Stalled": ("True", "NoFeasibleNode")}),
    ("a spec the operator refuses", {"model": "nosuch/model:7b"}, {}, None,
     {"Stalled": ("True", "InvalidSpec")}),
    ("offline render: nothing runs", {}, None, None, {}),
])
def test_the_pair_follows_the_state(name: str, spec: dict[str, Any], ready: dict[int, bool] | None,
                                    rolling: str | None, want: dict[str, tuple[str, str]]) -> None:
    got = status(MODEL.spec(**spec).obj(), ready, rolling)
    assert pair(got) == want, name
    for c in got.conditions:
        assert c.observed_generation == 3


def test_stalled_says_what_blocks_it() -> None:
    got = status(MODEL.spec(cpu=64).obj(), {})
    stalled = next(c for c in got.conditions if c.type == "Stalled")
    placed = next(c for c in got.conditions if c.type == "Placed")
    assert placed.status == ConditionStatus.FALSE
    assert stalled.message == placed.message and "replica 0" in stalled.message


def test_an_object_the_operator_cannot_parse_is_stalled() -> None:
    got = invalid_status(5, "spec.kvCache: not one of f16, q8_0, q4_0", None, NOW)
    assert pair(got) == {"Stalled": ("True", "InvalidSpec")}
    assert next(c for c in got.conditions if c.type == "Stalled").message.startswith(
        "spec.kvCache")


def test_the_pair_goes_away_when_the_model_is_ready_and_holds_its_time_while_true() -> None:
    model = MODEL.obj()
    starting = status(model, {0: False})
    later = status(model.model_copy(update={"status": starting}), {0: False}, now=LATER)
    [first] = [c for c in starting.conditions if c.type == "Reconciling"]
    [again] = [c for c in later.conditions if c.type == "Reconciling"]
    assert again.last_transition_time == first.last_transition_time == NOW
    done = status(model.model_copy(update={"status": later}), {0: True}, now=LATER)
    assert pair(done) == {}


@pytest.mark.parametrize(("name", "want", "ready"), [
    ("asleep", {}, ("True", "Asleep")),
    ("asleep, its pod kept", {}, ("True", "Asleep")),
    ("waking", {}, ("True", "Waking")),
    ("waking, its pod starting", {}, ("True", "Waking")),
    ("waiting for a node", {}, ("True", "Waking")),
    ("a wake that hits a gap", {"Reconciling": ("True", "ImagePullFailed")},
     ("False", "ImagePullFailed")),
])
def test_sleep_is_neither_reconciling_nor_stalled_and_a_broken_wake_is(
        name: str, want: dict[str, tuple[str, str]], ready: tuple[str, str]) -> None:
    got = idle_model(name).status
    assert got is not None
    assert pair(got) == want, name
    assert next((c.status.value, c.reason) for c in got.conditions if c.type == "Ready") == ready
    assert all(c.observed_generation == 3 for c in got.conditions)
