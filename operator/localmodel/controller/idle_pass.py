"""The idle decisions' place in a pass: what `plan.plan_pass` gathers from the
`Observed` for `idle.decide` (`idle_models`: each valid model with `spec.idle`
and replicas, with its stored `status.idle`, its activity readings, its homes
and its Ready replicas' nodes), the call before the plan (`decide_pass`) and
the one after it (`after_pass`: `idle.wakers.after_plan`). Pure.

A home is the one node a replica's claim can be used from (a bound claim
whose volume's node affinity only that node meets: a local volume); a claim
on a network volume, or not bound yet, makes none (rule 4 protects no node
for it). `replicas: 0` is off: such a model has no idle state at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from localmodel.api import IdleHome, LocalModel
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed
from localmodel.controller.volumes import Volume, volume_reaches
from localmodel.desired import DesiredState
from localmodel.idle.asks import IdleSignals
from localmodel.idle.decide import Decided, IdleModel, decide, fresh_readings, last_request
from localmodel.idle.schedule import Window
from localmodel.idle.state import IdlePolicy, Release
from localmodel.idle.wakers import NO_OUTCOME, IdleOutcome, after_plan
from localmodel.render.names import claim_name, pod_name


def policy_of(lm: LocalModel) -> IdlePolicy | None:
    """`spec.idle` as the core reads it; None without one, or with `replicas: 0`
    (off beats idle)."""
    idle = lm.spec.idle
    if idle is None or lm.spec.replicas == 0:
        return None
    windows = tuple(Window.of(w.from_, w.to, w.time_zone, w.days or ()) for w in idle.awake)
    return IdlePolicy(idle.after_seconds, idle.priority, Release(idle.release), windows)


def homes(obs: Observed, lm: LocalModel, uid: str) -> tuple[IdleHome, ...]:
    """Each replica's home: the node its claim (its own name first) is pinned to."""
    out = []
    for replica in range(lm.spec.replicas):
        own = claim_name(lm, replica)
        claims = sorted((c for c in obs.claims_of(lm.key)
                         if c.replica == replica and not c.terminating and c.volume
                         and c.owner_uid in (None, uid)),
                        key=lambda c: (c.name != own, c.name))
        for c in claims:
            vol = obs.volumes.get(c.volume or "")
            node = _pinned_to(vol, obs) if vol is not None else None
            if node is not None:
                out.append(IdleHome(replica=replica, node=node, claim=c.name))
                break
    return tuple(out)


_HOST_KEYS = (("matchExpressions", "kubernetes.io/hostname"), ("matchFields", "metadata.name"))


def _pinned_to(vol: Volume, obs: Observed) -> str | None:
    """The one node a volume can be used from, or None (any node, several, or
    none). A local volume names its node in one term (`hostname In [node]`,
    as the local-path provisioner and `local` volumes write it): the node of
    that name is checked alone (a hostname is one node's); any other affinity
    is evaluated against every node."""
    if vol.terms is None:
        return None
    if len(vol.terms) == 1:
        for section, key in _HOST_KEYS:
            for e in vol.terms[0].get(section) or []:
                values = e.get("values") if isinstance(e, Mapping) else None
                if (e.get("key") == key and e.get("operator") == "In"
                        and isinstance(values, list) and len(values) == 1):
                    node = obs.nodes.get(str(values[0]))
                    if node is not None and volume_reaches(vol, node):
                        return node.name
    reach = [n.name for n in obs.nodes.values() if volume_reaches(vol, n)]
    return reach[0] if len(reach) == 1 else None


def idle_model(obs: Observed, mo: ModelObject, lm: LocalModel,
               signals: IdleSignals) -> IdleModel | None:
    """One model as `idle.decide` reads it; None when it has no idle state."""
    policy = policy_of(lm)
    if policy is None or lm.spec.idle is None:
        return None
    replicas = lm.spec.replicas
    ready_on = tuple(sorted({p.node for p in obs.pods_of(lm.key)
                             if p.owner_uid == mo.uid and p.ready and p.node in obs.nodes
                             and p.node and not p.terminating}))
    pods = {p.replica: p for p in obs.pods_of(lm.key) if p.owner_uid == mo.uid}
    ips = tuple((pods[r].ip or "") if r in pods else "" for r in range(replicas))
    read = signals.readings.get(lm.key, {})
    stale = signals.settings.stale_s
    readings = fresh_readings(read, replicas, signals.now, stale)
    return IdleModel(
        key=lm.key, policy=policy, pods=tuple(pod_name(lm, r) for r in range(replicas)),
        hold_s=float(lm.spec.idle.hold_seconds),
        stored=mo.status.idle if mo.status is not None else None,
        readings=readings, homes=homes(obs, lm, mo.uid), ready_on=ready_on,
        last_request=last_request(read, signals.now, stale), ips=ips)


def idle_models(obs: Observed, models: Iterable[LocalModel],
                signals: IdleSignals) -> list[IdleModel]:
    """Every admitted model with an idle state, in key order."""
    out = []
    for lm in sorted(models, key=lambda m: m.key):
        mo = obs.models.get(lm.key)
        if mo is None or lm.spec.idle is None:
            continue
        try:
            found = idle_model(obs, mo, lm, signals)
        except Exception:  # one model's failure is that model's: no idle state this pass
            continue
        if found is not None:
            out.append(found)
    return out


def decide_pass(obs: Observed, models: Sequence[LocalModel],
                current: Mapping[str, Sequence[str | None]],
                signals: IdleSignals) -> tuple[list[IdleModel], Decided] | None:
    """The idle models and `idle.decide`'s answer; None when no admitted
    model has an idle state (nothing changes for any model)."""
    found = idle_models(obs, models, signals)
    if not found:
        return None
    pending = [lm.key for lm in models
               if lm.spec.replicas and (None in current.get(lm.key, (None,))
                                        or len(current.get(lm.key, ())) < lm.spec.replicas)]
    plain = [lm.key for lm in models if lm.spec.idle is None]
    return found, decide(found, signals, pending=pending, plain=plain)


def after_pass(decided: tuple[list[IdleModel], Decided] | None, state: DesiredState,
               obs: Observed, signals: IdleSignals | None) -> IdleOutcome:
    """`idle.wakers.after_plan` over the pass's plan: the reports for `with_idle` and
    the closes to send (none without idle models)."""
    if decided is None or signals is None:
        return NO_OUTCOME
    found, first = decided
    demands = {d.key: d for d in state.demands} if first.waking else {}
    return after_plan(first, found, state.plan, obs.nodes, obs.usage, demands, signals)
