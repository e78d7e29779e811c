"""A pass's plan, decided (`plan_pass`): the admin's policy over the models, the
desired state (with placements the watches do not show yet remembered from the
last pass, `with_memory`), then each model's share (`model_work.model_work`).
Pure. With a fresh `KeptWork` and `Desired` this is the plain path; the
reconciler passes its long-lived ones (work_memo.py, incremental/), and
tests/controller/test_pass_incremental.py holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any, cast

from localmodel.api import LocalModel
from localmodel.controller.changes import ModelChanges
from localmodel.controller.idle_pass import after_pass, decide_pass
from localmodel.controller.model_work import ModelWork, PassPlan, model_work
from localmodel.controller.observed import Observed, current_placements, readiness
from localmodel.controller.share_memo import Shares
from localmodel.controller.stuck import Avoid
from localmodel.controller.work_memo import KeptWork
from localmodel.desired import ModelResult, failure_text
from localmodel.errors import format_errors
from localmodel.idle.asks import IdleSignals
from localmodel.idle.decide import NO_IDLE
from localmodel.idle_status import IdleReport
from localmodel.incremental import Desired
from localmodel.render import RenderOptions
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import Reason, failed_status, invalid_status
from localmodel.tenancy import SecretLabels, TenantPolicy, refusals

Placed = Mapping[str, Mapping[int, str]]  # model -> replica -> node


def with_memory(current: Mapping[str, Sequence[str | None]], placed: Placed
                ) -> dict[str, tuple[str | None, ...]]:
    """Where replicas are: what the watches show, else where the last pass put
    them (its pods and status may not have reached the watches yet; without
    this, a pass right after a big one would plan those models afresh and
    move them). Tuples: the planner compares them with its own in C."""
    out: dict[str, tuple[str | None, ...]] = {}
    for key, nodes in current.items():
        remembered = placed.get(key) if None in nodes else None
        out[key] = tuple(nodes) if not remembered else tuple(
            remembered.get(replica) if node is None else node
            for replica, node in enumerate(nodes))
    return out


def admitted(obs: Observed, tenants: TenantPolicy, secrets: SecretLabels, now: str,
             check: Callable[..., Sequence[Any]] = refusals,
             models: Iterable[LocalModel] | None = None,
             ) -> tuple[list[LocalModel], list[ModelWork]]:
    """The models (`models`, else every valid one) the admin's policy admits, and
    the status-only work of those it refuses (Valid=False, RefusedByPolicy, each
    rule and field) or failed on."""
    ok: list[LocalModel] = []
    refused: list[ModelWork] = []
    for lm in obs.valid_models() if models is None else models:
        mo = obs.models[lm.key]
        try:
            found = check(lm, tenants, secrets)
        except Exception as exc:  # one model's failure is that model's
            failure = failure_text("admin policy", exc)
            refused.append(ModelWork(mo, ModelChanges(), failed_status(
                mo.generation, failure, mo.status, now), failure))
            continue
        if not found:
            ok.append(lm)
            continue
        refused.append(ModelWork(mo, ModelChanges(), invalid_status(mo.generation, format_errors(
            [r.error() for r in found]), mo.status, now, Reason.REFUSED_BY_POLICY)))
    return ok, refused


def _models_work(results: tuple[ModelResult, ...], obs: Observed, now: str,
                 options: RenderOptions, speeds: Mapping[str, Mapping[int, Published]],
                 policy: SpeedPolicy, kept: KeptWork, placed: Placed,
                 reports: Mapping[str, IdleReport],
                 ) -> tuple[Shares, Sequence[int], Shares | None]:
    """Each valid model's share, and where it puts its replicas: the last pass's
    shares with the positions `ShareMemo.shares_again` names worked out again
    (each kept while what it read holds, `ShareMemo.held`, else worked out with
    `model_work` and kept); those positions, and the last pass's shares (None:
    all worked out)."""
    images = (options.operator_image, options.image_pull_secrets)
    shares, todo, last = kept.shares.shares_again(results, now, speeds, policy, images,
                                                  reports)
    models, held, placement = obs.models, kept.shares.held, kept.shares.placement
    work, targets, placements, unkept = shares.work, shares.targets, shares.placed, shares.unkept
    none: Mapping[int, Published] = {}
    for i in todo:
        result = results[i]
        key = result.model.key
        mo = models[key]
        # A failed model keeps where it was (its pods are left as they are).
        placements[key] = dict(placed.get(key, {})) if result.failure else placement(result)
        if result.problems or result.failure:  # an invalid or failed one: its status only
            kept.shares.forget(key)
            unkept.add(i)
            work[i], targets[i] = ModelWork(mo, ModelChanges(), result.status, result.failure), ()
            continue
        published = speeds.get(key, none)
        report = reports.get(key)
        try:
            worked = held(result, mo.uid, obs, now, published, policy, images, report)
            if worked is None:
                worked = model_work(result, mo, obs, now, published, policy, *images,
                                    report=report)
                kept.shares.keep(result, mo.uid, obs, now, published, policy, images, worked,
                                 report)
        except Exception as exc:  # one model's failure is that model's (not kept)
            kept.shares.forget(key)
            unkept.add(i)
            failure = failure_text("changes or status", exc)
            work[i], targets[i] = ModelWork(mo, ModelChanges(), failed_status(
                mo.generation, failure, mo.status, now), failure), ()
            continue
        unkept.discard(i)
        work[i], targets[i] = worked
    return shares, todo, last


def plan_pass(obs: Observed, now: str, options: RenderOptions, *, placed: Placed,
              avoid: Avoid, speeds: Mapping[str, Mapping[int, Published]] | None = None,
              speed_policy: SpeedPolicy | None = None, desired: Desired | None = None,
              tenants: TenantPolicy | None = None, secrets: SecretLabels | None = None,
              kept: KeptWork | None = None, idle: IdleSignals | None = None) -> PassPlan:
    """The pure core of a pass: desired state, then each model's changes and status
    (with each replica's speed, `speeds`: model -> replica -> published numbers).
    `desired` and `kept` are the reconciler's long-lived `Desired` and `KeptWork`
    (a pass then costs what changed); without them, fresh ones: the same result.
    `tenants`: the admin's policy (models it refuses get their status only,
    `admitted`); `secrets`: the labels of the Secrets models name (`tenancy.needs_secrets`).
    `idle`: what the shell gathered for the models with `spec.idle` (None: no
    idle state for any); the plan's `idle` says what the shell does for them
    (the closes to send and to renew, when to run again)."""
    kept = kept if kept is not None else KeptWork()
    idle = idle if idle is not None and kept.idle.any_idle(obs) else None
    inputs = (obs, options, placed, avoid, speeds, speed_policy, tenants, secrets, desired, idle)
    if (same := kept.shares.same_pass(inputs, now)) is not None:
        return same  # a quiet pass: what the last one planned, from the very same inputs
    kept.begin(obs)
    speeds = speeds or {}
    policy = speed_policy or SpeedPolicy()
    tenants, secrets = tenants or TenantPolicy(), secrets or {}
    models, refused = kept.admits.admitted(obs, tenants, secrets, lambda some: admitted(
        obs, tenants, secrets, now, kept.admits.refusals, some))
    current = kept.current.current(current_placements(obs), placed, with_memory)
    decided = decide_pass(obs, models, current, idle) if idle is not None else None
    state = (desired or Desired()).state(
        models,
        list(obs.nodes.values()),
        now=now,
        current=current,
        usage=obs.usage,
        ready=readiness(obs),
        options=options,
        claims=kept.claims.chooser(obs),
        avoid={m: frozenset(nodes) for m, nodes in avoid.items()},
        claims_again=kept.claims.claims_again,
        idle=decided[1].inputs if decided is not None else NO_IDLE,
    )
    outcome = after_pass(decided, state, obs, idle)
    shares, todo, last = _models_work(state.models, obs, now, options, speeds, policy, kept,
                                      placed, outcome.reports)
    if last is None:
        kept.keep_only(shares.at.keys())
        # (a set keeps its largest table: a cold pass's 5 000)
        kept.shares.took = set(kept.shares.took)
    invalid = [ModelWork(mo, ModelChanges(), invalid_status(mo.generation, mo.error, mo.status,
                                                            now))
               for mo in kept.admits.invalid(obs)]
    done = cast(list[ModelWork], shares.work)  # (every position worked out)
    unkept = [*refused, *(done[i] for i in shares.unkept), *invalid]
    since = None
    if last is not None:  # the work that is not the last plan's very object
        since = (kept.shares.serial, {w.model.key: w for w in (*refused, *invalid)})
        since[1].update((done[i].model.key, done[i]) for i in todo if done[i] is not last.work[i])
    plan = PassPlan([*refused, *done, *invalid], shares.placed,
                    tuple(chain.from_iterable(shares.targets)), outcome,
                    kept.shares.serial + 1, since)
    return kept.shares.remember(inputs, now, plan, shares, unkept)
