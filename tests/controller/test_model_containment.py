"""One bad model stays one bad model (localmodel/desired.py `failed_result`,
incremental.Desired, controller/plan.py `plan_pass`): an exception while
computing one model (its rules, render, status, changes) marks that model and
every other model comes out exactly as it would without the failure.

The failures are injected (monkeypatch) into the real functions of the pass,
raising only for the chosen models; the worlds are test_pass_memo.py's random
ones (many alike models and nodes, so work shared between models is shared
with the failing ones too)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localmodel.api import ConditionStatus, LocalModel
from localmodel.controller import admit_memo, model_work
from localmodel.controller.plan import plan_pass
from localmodel.controller.snapshot import observe
from localmodel.desired import ModelResult, desired_state
from localmodel.incremental import Desired
from localmodel.incremental import desired as incremental
from localmodel.planner import Usage
from localmodel.render import RenderOptions
from localmodel.status import ConditionType, Reason
from tests.controller.test_changes import NOW, converged
from tests.controller.test_pass_memo import G, local_model, random_node, spec

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Injected(RuntimeError):
    """The failure a test injects."""


def _raising(victims: set[str], key_of: Callable[..., str], real: Callable[..., Any]
             ) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if key_of(*args, **kwargs) in victims:
            raise Injected("injected")
        return real(*args, **kwargs)
    return wrapper


# Where a failure is injected in the operator's pass: (stage, module, function,
# the model key from its arguments).
STAGES: dict[str, tuple[Any, str, Callable[..., str]]] = {
    "rules": (incremental.Desired, "_tune", lambda self, key, *a, **k: key),
    "render": (incremental, "pod_digest", lambda lm, *a, **k: lm.key),
    "status": (incremental, "model_status", lambda lm, *a, **k: lm.key),
}


@contextmanager
def failing(monkeypatch: pytest.MonkeyPatch, stage: str, victims: set[str]) -> Iterator[None]:
    where, name, key_of = STAGES[stage]
    with monkeypatch.context() as m:
        m.setattr(where, name, _raising(victims, key_of, getattr(where, name)))
        yield


def failed_on(result: ModelResult) -> bool:
    ready = [c for c in result.status.conditions if c.type == ConditionType.READY.value]
    return bool(result.failure) and ready[0].reason == Reason.RECONCILE_FAILED.value and (
        ready[0].status == ConditionStatus.FALSE) and "Injected" in ready[0].message


def world(rnd: random.Random) -> tuple[list[LocalModel], dict[str, Any], Any]:
    nodes = [random_node(f"n{i}", rnd) for i in range(rnd.randrange(1, 8))]
    models = [local_model(f"m{i}", spec(rnd)) for i in range(rnd.randrange(2, 12))]
    args = dict(now="2026-01-01T00:00:00Z",
                usage={n.name: Usage(rnd.randrange(1500), rnd.randrange(3) * G) for n in nodes},
                ready={lm.key: {0: rnd.random() < 0.5} for lm in models},
                options=RenderOptions())
    return models, args, nodes


@PROPERTY
@given(st.randoms(use_true_random=False), st.sampled_from(sorted(STAGES)))
def test_failures_in_random_models_leave_every_other_model_as_it_would_be(
        monkeypatch: pytest.MonkeyPatch, rnd: random.Random, stage: str) -> None:
    models, args, nodes = world(rnd)
    victims = {lm.key for lm in models if rnd.random() < 0.4}
    want = Desired().state(models, nodes, **args)
    # A long-lived Desired, as the operator's: the failing pass, then one without
    # failures (what failed is worked out again; the rest is kept).
    desired = Desired()
    with failing(monkeypatch, stage, victims):
        got = desired.state(models, nodes, **args)
    assert got.plan == want.plan  # failures after placement move nobody
    for g, w in zip(got.models, want.models, strict=True):
        if g.model.key not in victims:
            assert g == w, g.model.key
            assert g.objects == w.objects, g.model.key
        elif not w.problems and (w.replicas or stage == "status"):
            assert failed_on(g), (stage, g.model.key, g.status)
            assert (g.replicas, g.pod_hashes, g.applied_hashes) == ((), {}, {})
    # The failure gone, the failed models come back as they would have been.
    again = desired.state(models, nodes, **args)
    assert again.models == want.models


@PROPERTY
@given(st.randoms(use_true_random=False), st.sampled_from(sorted(STAGES)))
def test_the_plain_path_contains_the_same_failures(monkeypatch: pytest.MonkeyPatch,
                                                   rnd: random.Random, stage: str) -> None:
    """The plain path (the specification) fails the same models the same way."""
    models, args, nodes = world(rnd)
    victims = {lm.key for lm in models if rnd.random() < 0.4}
    plain = {"rules": ("evaluate", lambda spec, *a, **k: by_spec[id(spec)]),
             "render": ("render_objects", lambda lm, *a, **k: lm.key),
             "status": ("model_status", lambda lm, *a, **k: lm.key)}
    by_spec = {id(lm.spec): lm.key for lm in models}
    import localmodel.desired as plain_module
    want = desired_state(models, nodes, **args)
    name, key_of = plain[stage]
    with monkeypatch.context() as m:
        real = getattr(plain_module, name)
        # `evaluate` also sizes each spec before placement (`prepare`'s default
        # argument, bound at import): only the per-replica call is replaced here.
        m.setattr(plain_module, name, _raising(victims, key_of, real))
        got = desired_state(models, nodes, **args)
    for g, w in zip(got.models, want.models, strict=True):
        if g.model.key not in victims:
            assert g == w, g.model.key
        elif not w.problems and (w.replicas or stage == "status"):
            assert failed_on(g), (stage, g.model.key)


def test_a_model_whose_sizing_raises_is_marked_not_placed_and_the_others_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad = (local_model(n, {"model": "qwen3:0.6b", "placement": {"exclusive": False}})
                 for n in ("good", "bad"))
    nodes = [random_node("n0", random.Random(1))]
    import localmodel.desired as plain_module
    prepare = plain_module.prepare
    monkeypatch.setattr(plain_module, "prepare", lambda s, *a: (
        (_ for _ in ()).throw(Injected("sizing")) if s is bad.spec else prepare(s, *a)))
    state = Desired().state([good, bad], nodes, now=NOW)
    by_key = {r.model.key: r for r in state.models}
    assert failed_on(by_key[bad.key]) and "shape and sizing" in by_key[bad.key].failure
    # Not placed: the others come out as in a world without it.
    alone = Desired().state([good], nodes, now=NOW)
    assert by_key[good.key] == alone.models[0] and state.plan == alone.plan


def test_a_failure_in_one_models_changes_leaves_the_others_work_as_it_would_be(
        monkeypatch: pytest.MonkeyPatch) -> None:
    snap, _ = converged(replicas=2)
    obs = observe(snap)
    want = plan_pass(obs, NOW, RenderOptions(), placed={}, avoid={})
    [key] = [w.model.key for w in want.work]
    real = model_work.model_changes
    monkeypatch.setattr(model_work, "model_changes", lambda result, uid, o, idle=None: (
        (_ for _ in ()).throw(Injected("changes")) if result.model.key == key
        else real(result, uid, o, idle)))
    got = plan_pass(obs, NOW, RenderOptions(), placed={key: {0: "n0"}}, avoid={})
    [work] = got.work
    assert work.failure.startswith("changes or status: Injected")
    assert not work.changes.changes  # nothing is deleted or replaced for it
    assert got.placed[key] == want.placed[key]  # placed as planned: none of its pods moves
    ready = [c for c in work.status.conditions if c.type == ConditionType.READY.value]
    assert ready[0].reason == Reason.RECONCILE_FAILED.value
    # Its stored placements are kept in its status, as stored.
    assert work.status.placements == (work.model.status.placements if work.model.status
                                      else [])


def test_a_failure_in_the_admin_policy_check_marks_that_model_and_creates_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    snap, _ = converged(replicas=2)
    obs = observe(snap)
    want = plan_pass(obs, NOW, RenderOptions(), placed={}, avoid={})
    [key] = [w.model.key for w in want.work]
    monkeypatch.setattr(admit_memo, "refusals", _raising({key}, lambda lm, *a, **k: lm.key,
                                                     admit_memo.refusals))
    got = plan_pass(obs, NOW, RenderOptions(), placed={}, avoid={})
    [work] = got.work
    assert work.failure.startswith("admin policy: Injected")
    assert not work.changes.changes  # nothing is created, deleted or replaced for it
    ready = [c for c in work.status.conditions if c.type == ConditionType.READY.value]
    assert ready[0].reason == Reason.RECONCILE_FAILED.value
