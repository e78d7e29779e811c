"""The doorman in the operator's changes (controller/changes.py,
`doorman_changes`), as a table over observed worlds: a released model's
Service is answered by its doorman (render/doorman.py) from the release until
its first replica is Ready; a resident sleeper, an awake model, a model off
(`replicas: 0`) or without `spec.idle` has none; a model whose idle state is
unknown this pass keeps what it has."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.api import IdleLastWake, IdleStatus
from localmodel.controller.changes import Create, Delete, choose_claim, model_changes
from localmodel.controller.observed import current_placements, readiness
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.desired import ModelResult
from localmodel.idle.decide import IdleInputs
from localmodel.incremental import Desired
from localmodel.render import RenderOptions
from localmodel.render.doorman import doorman_objects
from tests.controller.test_changes import NODE, NOW, QWEN, UID, _with, converged, stored, summary

pytestmark = pytest.mark.unit

SLEEPER = QWEN.spec(idle={"after": "30m", "release": "WhenAsleep"})
ROUTER = "http://localmodel-router.localmodel:80"
OPTIONS = RenderOptions(router_url=ROUTER)
SINCE = "2026-12-01T00:00:00Z"
RELEASED = IdleStatus(state="Asleep", resident=False, since=SINCE,
                      last_wake=IdleLastWake(seconds=14.2, node="n0"))
WAKING = IdleStatus(state="Waking", resident=False, since=SINCE)
RESIDENT = IdleStatus(state="Asleep", resident=True, since=SINCE)
AWAKE = IdleStatus(state="Awake", resident=True, since=SINCE)


def doorman(make: Any = SLEEPER, *, uid: str = UID, terminating: bool = False) -> dict[str, Any]:
    [pod] = doorman_objects(make.uid(uid).obj(), OPTIONS)
    return stored(pod, node_name="n1", terminating=terminating)


def world(make: Any = SLEEPER, *, pods: str = "ready", doormen: tuple[dict[str, Any], ...] = ()
          ) -> Snapshot:
    """The model with its objects stored; its pods Ready, starting (not
    Ready), terminating or gone."""
    snap, result = converged(1, **{k: v for k, v in make.obj().spec.model_dump(
        by_alias=True, exclude_none=True, mode="json").items() if k == "idle"})
    snap = Snapshot(**{**snap.__dict__, "localmodels": [make.manifest()]})
    if pods != "ready":
        snap = Snapshot(**{**snap.__dict__, "pods": []})
        if pods in ("starting", "terminating"):
            snap = _with(snap, [o for o in result.objects if o["kind"] == "Pod"], ready=False,
                         terminating=pods == "terminating")
    return Snapshot(**{**snap.__dict__, "pods": [*snap.pods, *doormen]})


def result_of(snap: Snapshot, released: bool) -> tuple[Any, ModelResult]:
    obs = observe(snap)
    [lm] = obs.valid_models()
    state = Desired().state(
        [lm], list(obs.nodes.values()), now=NOW, current=current_placements(obs),
        usage=obs.usage, ready=readiness(obs), options=OPTIONS,
        claims=lambda m, r, n: choose_claim(m, r, n, obs),
        idle=IdleInputs(released=frozenset({lm.key}) if released else frozenset()))
    [result] = state.models
    return obs, result


def doorman_summary(snap: Snapshot, idle: IdleStatus | None, released: bool = False
                    ) -> list[str]:
    obs, result = result_of(snap, released)
    return [s for s in summary(model_changes(result, UID, obs, idle)) if "doorman" in s]


# (why, world, this pass's idle state, released, the doorman's changes)
TABLE: list[tuple[str, Any, IdleStatus | None, bool, list[str]]] = [
    ("released this pass: its Ready pods are deleted first", lambda: world(), RELEASED, True,
     []),
    ("released, its pods terminating", lambda: world(pods="terminating"), RELEASED, True,
     ["create Pod qwen3-doorman"]),
    ("released, its pods gone", lambda: world(pods="gone"), RELEASED, True,
     ["create Pod qwen3-doorman"]),
    ("released, its doorman there", lambda: world(pods="gone", doormen=(doorman(),)),
     RELEASED, True, []),
    ("waking, its pods not Ready yet: the doorman stays",
     lambda: world(pods="starting", doormen=(doorman(),)), WAKING, False, []),
    ("waking with no doorman (not released before): one answers until Ready",
     lambda: world(pods="starting"), WAKING, False, ["create Pod qwen3-doorman"]),
    ("waking, the first replica Ready", lambda: world(doormen=(doorman(),)), WAKING, False,
     ["delete Pod qwen3-doorman"]),
    ("awake", lambda: world(doormen=(doorman(),)), AWAKE, False,
     ["delete Pod qwen3-doorman"]),
    ("awake, no doorman", lambda: world(), AWAKE, False, []),
    ("a resident sleeper has none", lambda: world(), RESIDENT, False, []),
    ("a resident sleeper's doorman goes", lambda: world(doormen=(doorman(),)), RESIDENT, False,
     ["delete Pod qwen3-doorman"]),
    ("lost spec.idle", lambda: world(QWEN, doormen=(doorman(),)), None, False,
     ["delete Pod qwen3-doorman"]),
    ("off: replicas 0", lambda: world(SLEEPER.replicas(0), pods="gone", doormen=(doorman(),)),
     None, False, ["delete Pod qwen3-doorman"]),
    ("its idle state unknown this pass: left as it is",
     lambda: world(pods="gone", doormen=(doorman(),)), None, False, []),
    ("its idle state unknown, none there: none made", lambda: world(pods="gone"), None, False,
     []),
    ("already going: not deleted twice",
     lambda: world(doormen=(doorman(terminating=True),)), AWAKE, False, []),
    ("an earlier model's of the same name: never ours to delete, and none made beside it",
     lambda: world(pods="gone", doormen=(doorman(uid="uid-old"),)), RELEASED, True, []),
]


@pytest.mark.parametrize(("why", "make", "idle", "released", "want"), TABLE,
                         ids=[row[0] for row in TABLE])
def test_the_doorman_changes(why: str, make: Any, idle: IdleStatus | None, released: bool,
                             want: list[str]) -> None:
    assert doorman_summary(make(), idle, released) == want, why


def test_a_released_models_doorman_is_the_rendered_one_with_its_last_wake_and_the_router() -> None:
    obs, result = result_of(world(pods="gone"), released=True)
    [create] = [c for c in model_changes(result, UID, obs, RELEASED).changes
                if isinstance(c, Create)]
    assert create.manifest == doorman_objects(SLEEPER.obj(), OPTIONS, router_url=ROUTER,
                                              wake_seconds=14.2)[0]
    env = {e["name"]: e.get("value") for e in create.manifest["spec"]["containers"][0]["env"]}
    assert env["LOCALMODEL_GATEWAY_ROUTER_URL"] == ROUTER
    assert env["LOCALMODEL_GATEWAY_WAKE_SECONDS"] == "15"
    owner = create.manifest["metadata"]["ownerReferences"][0]
    assert (owner["uid"], owner["controller"]) == (UID, True)  # deleted with the model


def test_without_the_router_url_the_doorman_names_no_router() -> None:
    obs = observe(world(pods="gone"))
    [lm] = obs.valid_models()
    result = Desired().state(
        [lm], list(obs.nodes.values()), now=NOW, current=current_placements(obs),
        usage=obs.usage, ready=readiness(obs), options=RenderOptions(),
        claims=lambda m, r, n: choose_claim(m, r, n, obs),
        idle=IdleInputs(released=frozenset({lm.key}))).models[0]
    [create] = [c for c in model_changes(result, UID, obs, RELEASED).changes
                if isinstance(c, Create)]
    names = {e["name"] for e in create.manifest["spec"]["containers"][0]["env"]}
    assert "LOCALMODEL_GATEWAY_ROUTER_URL" not in names


def test_a_ready_replica_on_a_node_that_is_gone_is_not_serving() -> None:
    """The doorman stays while the only Ready pod is on a node that left."""
    snap = world(pods="ready", doormen=(doorman(),))
    snap = Snapshot(**{**snap.__dict__, "nodes": [NODE.named("n1").manifest(),
                                                  NODE.named("n2").manifest()]})
    assert doorman_summary(snap, WAKING) == []


def test_a_deleted_doorman_says_why() -> None:
    obs, result = result_of(world(doormen=(doorman(),)), released=False)
    [delete] = [c for c in model_changes(result, UID, obs, AWAKE).changes
                if isinstance(c, Delete) and "doorman" in c.name]
    assert (delete.kind, delete.uid) == ("Pod", "uid-qwen3-doorman")
    assert "Ready" in delete.why
