"""A model with spec.idle in each state the operator reports (asleep, waking,
waiting for a node, a wake that hits a gap), as the operator's pure path writes
it: the plain status, its roll and gap, then `idle_status.with_idle`. Read by
the kstatus-pair table and by kstatus and Argo CD's check themselves."""

from __future__ import annotations

from typing import Any

from localmodel.api import IdleHome, IdleStatus, IdleWake, LocalModel
from localmodel.desired import desired_state
from localmodel.gaps import Gap, with_gap
from localmodel.idle_status import IdleReport, with_idle
from localmodel.status import Reason, status_body, with_progress
from tests.builders import MakeLocalModel, MakeNode

NOW = "2026-12-01T21:00:00Z"
NODE = MakeNode("small-0").cpu_flags({"AVX2"}).facts()
MODEL = MakeLocalModel("qwen3").namespace("ai").uid("u1").generation(3).cpu(4).spec(
    idle={"after": "30m"})
HOME = [IdleHome(replica=0, node="small-0", claim="qwen3-weights-0")]

# name: (placed on small-0, replica 0 ready, the gap, status.idle, the Awake reason,
# the roll: what the plain path says of pods starting, as with_progress takes it)
CASES: dict[str, tuple[bool, bool, Gap | None, IdleStatus, Reason, str | None]] = {
    "asleep": (False, False, None,
               IdleStatus(state="Asleep", since=NOW, resident=False, homes=HOME),
               Reason.ASLEEP, None),
    "asleep, its pod kept": (True, True, None,
                             IdleStatus(state="Asleep", since=NOW, homes=HOME),
                             Reason.ASLEEP, None),
    "waking": (True, False, None,
               IdleStatus(state="Waking", since=NOW, resident=False, homes=HOME,
                          wake=IdleWake(wanted_at=NOW, held=2, node="small-0")),
               Reason.WAKING, None),
    # As the real node showed it (tests/realnode/test_idle_on_node.py): the
    # woken pod starting is a roll on the plain path.
    "waking, its pod starting": (True, False, None,
                                 IdleStatus(state="Waking", since=NOW, resident=False,
                                            homes=HOME, wake=IdleWake(wanted_at=NOW, held=1,
                                                                      node="small-0")),
                                 Reason.WAKING, "replica 0: starting on small-0"),
    "waiting for a node": (False, False, None,
                           IdleStatus(state="Waking", since=NOW, resident=False, homes=HOME,
                                      wake=IdleWake(wanted_at=NOW, held=1,
                                                    message="small-0 is held by ai/embed")),
                           Reason.WAITING_FOR_NODE, None),
    "a wake that hits a gap": (True, False,
                               Gap(Reason.IMAGE_PULL_FAILED, "replica 0: image not found"),
                               IdleStatus(state="Waking", since=NOW, resident=False,
                                          wake=IdleWake(wanted_at=NOW, node="small-0")),
                               Reason.WAKING, None),
}


def idle_model(name: str) -> LocalModel:
    """The model with the status the operator writes in state `name` (CASES)."""
    placed, ready, gap, idle, awake, rolling = CASES[name]
    lm = MODEL.obj()
    [r] = desired_state([lm], [NODE] if placed else [], now=NOW,
                        ready={lm.key: {0: ready} if placed else {}}).models
    status = with_gap(with_progress(r.status, rolling, lm, NOW), gap, lm, NOW)
    status = with_idle(status, IdleReport(idle, awake), lm, NOW)
    return lm.model_copy(update={"status": status})


def idle_object(name: str) -> dict[str, Any]:
    """`idle_model(name)` as `kubectl get -o json` shows it."""
    lm = idle_model(name)
    assert lm.status is not None
    return {**MODEL.manifest(), "status": status_body(lm.status)}
