"""kstatus and the Argo CD Lua check (docs/gitops/localmodel-health.lua) on
recorded LocalModels, no cluster needed: both run in `lmhealth` (kstatus from
sigs.k8s.io/cli-utils, the Lua in gopher-lua as Argo CD runs it).

tests/fixtures/gitops/watched.json is every version of three LocalModels that
`kubectl get -w -o json` delivered on the test cluster (tests/e2e/test_day2.py
with LOCALMODEL_RECORD_HEALTH=tests/fixtures/gitops): created and rolled, a spec
the operator refuses, a model no node can take. A model with spec.idle in each
state is the operator's pure path's output (tests/gitops/idle_cases.py).
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest

from tests.gitops.idle_cases import CASES, idle_object
from tests.harness import Tools
from tests.harness.fixtures import tools_or_fail
from tests.harness.tools import REPO_ROOT

LUA = REPO_ROOT / "docs" / "gitops" / "localmodel-health.lua"
WATCHED = REPO_ROOT / "tests" / "fixtures" / "gitops" / "watched.json"
ARGO_OF = {"InProgress": "Progressing", "Current": "Healthy", "Failed": "Degraded",
           "Terminating": "Progressing"}


@pytest.fixture(scope="module")
def tools() -> Tools:
    return tools_or_fail(("lmhealth",))


def verdicts(tools: Tools, objects: str) -> list[dict[str, Any]]:
    out = subprocess.run([str(tools["lmhealth"]), "-lua", str(LUA)], input=objects,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def recorded() -> list[dict[str, Any]]:
    decoder, text, at, objs = json.JSONDecoder(), WATCHED.read_text(), 0, []
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at < len(text):
            obj, at = decoder.raw_decode(text, at)
            objs.append(obj)
    return objs


def test_both_agree_on_every_recorded_version(tools: Tools) -> None:
    got = verdicts(tools, WATCHED.read_text())
    assert len(got) == len(recorded()) >= 8
    for v in got:
        assert v["lua"]["status"] == ARGO_OF[v["kstatus"]["status"]], v
    last = {v["name"]: v["kstatus"]["status"] for v in got}
    assert last == {"roll": "Current", "invalid": "Failed", "unplaceable": "Failed"}
    seen = {(v["name"], v["kstatus"]["status"]) for v in got}
    assert ("roll", "InProgress") in seen


def _variant(base: dict[str, Any], **change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    for path, value in change.items():
        *parents, leaf = path.split("__")
        node = obj
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return obj


def test_each_rule_of_the_check_against_kstatus(tools: Tools) -> None:
    """Edits of a recorded Ready object, one per rule, in kstatus's order."""
    ready = next(o for o in reversed(recorded()) if o["metadata"]["name"] == "roll")
    conds = ready["status"]["conditions"]
    gen = ready["metadata"]["generation"]
    cases = {
        "ready": (ready, "Current"),
        "deleting": (_variant(ready, metadata__deletionTimestamp="2026-12-01T00:00:00Z"),
                     "Terminating"),
        "edited, not yet observed": (_variant(ready, metadata__generation=gen + 1),
                                     "InProgress"),
        "reconciling": (_variant(ready, status__conditions=[*conds, {
            "type": "Reconciling", "status": "True", "reason": "RollingUpdate",
            "message": "replica 1: starting on n1", "lastTransitionTime": "x"}]),
            "InProgress"),
        "stalled": (_variant(ready, status__conditions=[*conds, {
            "type": "Stalled", "status": "True", "reason": "NoFeasibleNode",
            "message": "replica 1: no node", "lastTransitionTime": "x"}]), "Failed"),
        "not ready": (_variant(ready, status__conditions=[
            {**c, "status": "False"} if c["type"] == "Ready" else c for c in conds]),
            "InProgress"),
    }
    text = "\n".join(json.dumps(obj) for obj, _ in cases.values())
    got = verdicts(tools, text)
    for (name, (_, want)), v in zip(cases.items(), got, strict=True):
        assert v["kstatus"]["status"] == want, (name, v)
        assert v["lua"]["status"] == ARGO_OF[want], (name, v)


def test_without_any_status_the_check_waits_where_kstatus_says_current(tools: Tools) -> None:
    """The one documented difference (docs/gitops.md): only an object from a CRD
    without the observedGeneration default can have no status at all."""
    bare = _variant(recorded()[0], status=None)
    [v] = verdicts(tools, json.dumps(bare))
    assert (v["kstatus"]["status"], v["lua"]["status"]) == ("Current", "Progressing")


def test_a_sleeping_or_waking_model_reads_healthy_and_a_broken_wake_does_not(
        tools: Tools) -> None:
    """kstatus Current and Argo CD Healthy while asleep, waiting for a node or
    waking (a Flux Kustomization with `wait: true` does not time out at night);
    a wake that hits a gap is InProgress, with the gap's reason."""
    want = {"asleep": "Current", "asleep, its pod kept": "Current", "waking": "Current",
            "waking, its pod starting": "Current", "waiting for a node": "Current",
            "a wake that hits a gap": "InProgress"}
    assert want.keys() == CASES.keys()
    got = verdicts(tools, "\n".join(json.dumps(idle_object(name)) for name in want))
    for (name, status), v in zip(want.items(), got, strict=True):
        assert v["kstatus"]["status"] == status, (name, v)
        assert v["lua"]["status"] == ARGO_OF[status], (name, v)
    asleep, *_, broken = got
    assert asleep["lua"]["message"].startswith("Asleep: asleep since"), asleep
    assert broken["lua"]["message"].startswith("ImagePullFailed"), broken
