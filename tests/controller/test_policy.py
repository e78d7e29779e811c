"""The reconciler's decisions (controller/refused.py, expectations.py, stuck.py,
reports.py), as tables.

Refused writes are classified from the API server's Status (code and
`details.causes`), expectations decide whether a write is made again while the
watches lag, the stuck-pod policy decides which nodes a model avoids and what
it says, and the Event object is built from an `EventSpec`.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localmodel import API_VERSION
from localmodel.contract import ANNOTATION_APPLIED_HASH
from localmodel.controller.changes import Apply, Change, Create, Delete
from localmodel.controller.expectations import (
    EXPECT_SECONDS,
    Expectations,
    Lag,
    Wrote,
    expectation,
    lag,
)
from localmodel.controller.objects import OwnedDoorman, OwnedObject, OwnedPod
from localmodel.controller.observed import Observed
from localmodel.controller.plan import with_memory
from localmodel.controller.refused import Refusal, event_settled, refusal, settled, status_settled
from localmodel.controller.reports import (
    RETRY_SECONDS,
    Failures,
    Involved,
    event_manifest,
    retry_after,
)
from localmodel.controller.stuck import AVOID_SECONDS, StuckPod, avoid_stuck
from localmodel.controller.writer import KubeError
from localmodel.events import EventReason, EventSpec

pytestmark = pytest.mark.unit

# ---- refused writes --------------------------------------------------------------


def status_body(code: int, reason: str, message: str, causes: list[dict[str, str]] | None = None
                ) -> dict[str, Any]:
    """A metav1.Status as the API server sends it with an error."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if causes is not None:
        body["details"] = {"causes": causes}
    return body


TERMINATING = status_body(
    403, "Forbidden",
    'pods "chat-0" is forbidden: unable to create new content in namespace ai because it '
    "is being terminated",
    [{"reason": "NamespaceTerminating", "message": "namespace ai is being terminated",
      "field": "metadata.namespace"}])
RBAC = status_body(403, "Forbidden", 'pods is forbidden: User "x" cannot create resource '
                   '"pods" in API group "" in the namespace "ai"')
# The message says "being terminated", the causes do not: text is not meaning.
LOOKALIKE = status_body(403, "Forbidden", "webhook says: being terminated")
NOT_FOUND = status_body(404, "NotFound", 'pods "chat-0" not found')
EXISTS = status_body(409, "AlreadyExists", 'pods "chat-0" already exists')
PRECONDITION = status_body(409, "Conflict", "Precondition failed: UID in precondition: x")
INVALID = status_body(422, "Invalid", "Pod is invalid")

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat-0", "namespace": "ai"}}
CREATE = Create(POD)
DELETE = Delete("Pod", "ai", "chat-0", "uid-chat-0")
DOORMAN = Create({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "chat-doorman", "namespace": "ai"}})
APPLY = Apply({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "chat", "namespace": "ai",
                            "annotations": {ANNOTATION_APPLIED_HASH: "h1"}}})

REFUSALS = [
    # body, refusal, settled for (create, delete, apply), status settled, event settled
    (TERMINATING, Refusal.NAMESPACE_ENDING, (True, True, True), True, True),
    (RBAC, Refusal.OTHER, (False, False, False), False, False),
    (LOOKALIKE, Refusal.OTHER, (False, False, False), False, False),
    (NOT_FOUND, Refusal.NOT_FOUND, (True, True, False), True, False),
    (EXISTS, Refusal.CONFLICT, (True, True, False), False, False),
    (PRECONDITION, Refusal.CONFLICT, (True, True, False), False, False),
    (INVALID, Refusal.OTHER, (False, False, False), False, False),
    ("upstream connect error", Refusal.OTHER, (False, False, False), False, False),
]


@pytest.mark.parametrize(("body", "want", "changes", "status", "event"), REFUSALS)
def test_a_refused_write_is_read_from_its_code_and_causes(
    body: Any, want: Refusal, changes: tuple[bool, bool, bool], status: bool, event: bool
) -> None:
    code = body["code"] if isinstance(body, dict) else 503
    exc = KubeError("POST", "/api/v1/namespaces/ai/pods", code, body)
    why = refusal(exc.status, exc.causes)
    assert why is want
    assert tuple(settled(c, why) for c in (CREATE, DELETE, APPLY)) == changes
    assert (status_settled(why), event_settled(why)) == (status, event)


def test_retries_back_off_and_stay_at_the_longest_wait() -> None:
    assert [retry_after(n) for n in range(7)] == [*RETRY_SECONDS, RETRY_SECONDS[-1],
                                                 RETRY_SECONDS[-1]]


# ---- expectations ----------------------------------------------------------------

NOW = 1000.0


def world(pod: bool = False, service_hash: str | None = None, doorman: bool = False
          ) -> Observed:
    obs = Observed()
    if doorman:
        obs.doormen[("ai", "chat-doorman")] = OwnedDoorman(
            "ai", "chat-doorman", "uid-d", "ai/chat", "uid", "n1", True, False)
    if pod:
        obs.pods[("ai", "chat-0")] = OwnedPod("ai", "chat-0", "uid-chat-0", "ai/chat", "uid",
                                              0, "n1", "x", True, False, None)
    if service_hash is not None:
        obs.objects[("Service", "ai", "chat")] = OwnedObject(
            "Service", "ai", "chat", "uid-svc", "ai/chat", "uid", service_hash)
    return obs


def apply_with(digest: str) -> Apply:
    manifest = {**APPLY.manifest, "metadata": {**APPLY.manifest["metadata"],
                                               "annotations": {ANNOTATION_APPLIED_HASH: digest}}}
    return Apply(manifest)


def owned(change: Create, uid: str) -> Create:
    meta = {**change.manifest["metadata"], "ownerReferences": [{"uid": uid, "name": "chat"}]}
    return Create({**change.manifest, "metadata": meta})


EXPECTATIONS: list[tuple[str, Change, Change, Observed, float, Lag]] = [
    # name, written, now wanted, what the watches show, seconds later, verdict
    ("created, watch lags", CREATE, CREATE, world(), 1, Lag.WAIT),
    ("created, watch shows it", CREATE, CREATE, world(pod=True), 1, Lag.CAUGHT_UP),
    ("created, then a delete is wanted", CREATE, DELETE, world(), 1, Lag.OTHER),
    ("deleted, watch lags", DELETE, DELETE, world(pod=True), 1, Lag.WAIT),
    ("deleted, watch shows it gone", DELETE, CREATE, world(), 1, Lag.CAUGHT_UP),
    ("deleted, a create is wanted while it shows", DELETE, CREATE, world(pod=True), 1,
     Lag.OTHER),
    ("applied, watch lags", apply_with("h1"), apply_with("h1"), world(service_hash="h0"), 1,
     Lag.WAIT),
    ("applied, watch shows the hash", apply_with("h1"), apply_with("h1"),
     world(service_hash="h1"), 1, Lag.CAUGHT_UP),
    ("applied, the spec changed again", apply_with("h1"), apply_with("h2"),
     world(service_hash="h0"), 1, Lag.OTHER),
    ("waited long enough", CREATE, CREATE, world(), EXPECT_SECONDS + 1, Lag.CAUGHT_UP),
    # A doorman is a pod of the model's, never a replica: the watches show it all the same.
    ("a doorman created, watch lags", DOORMAN, DOORMAN, world(pod=True), 1, Lag.WAIT),
    ("a doorman created, watch shows it", DOORMAN, DOORMAN, world(doorman=True), 1,
     Lag.CAUGHT_UP),
    # The model was deleted and made again (a new uid) before the watches showed
    # the first one's pod, which its deletion collected: the new one needs its own.
    ("created for a model of the same name that is gone", owned(CREATE, "uid-1"),
     owned(CREATE, "uid-2"), world(), 1, Lag.OTHER),
    ("created for this very model, watch lags", owned(CREATE, "uid-1"),
     owned(CREATE, "uid-1"), world(), 1, Lag.WAIT),
]


@pytest.mark.parametrize(("written", "wanted", "obs", "later", "want"),
                         [e[1:] for e in EXPECTATIONS], ids=[e[0] for e in EXPECTATIONS])
def test_a_write_the_watches_have_not_shown_is_not_made_again(
    written: Change, wanted: Change, obs: Observed, later: float, want: Lag
) -> None:
    assert lag(expectation(written, NOW), wanted, obs, NOW + later) is want
    expected = Expectations()
    expected.wrote(written, NOW)
    assert expected.waiting(wanted, obs, NOW + later) is (want is Lag.WAIT)
    # Caught up: forgotten, so the next pass acts on what it sees.
    assert (wanted.target in expected.by_target) is (want is not Lag.CAUGHT_UP)


def test_an_expectation_has_a_type_not_a_string() -> None:
    assert expectation(CREATE, NOW).wrote is Wrote.CREATED
    assert expectation(DELETE, NOW).wrote is Wrote.DELETED
    applied = expectation(apply_with("h7"), NOW)
    assert (applied.wrote, applied.digest, applied.until) == (Wrote.APPLIED, "h7",
                                                              NOW + EXPECT_SECONDS)


# ---- stuck pods ----------------------------------------------------------------------

THRESHOLD = 60.0
NODE_ONLY = "0/3 nodes are available: 1 Insufficient memory."
ANY_NODE = 'pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes'


def stuck(age: float, node: str = "n1", message: str = NODE_ONLY, pod: str = "chat-0"
          ) -> StuckPod:
    return StuckPod("ai/chat", int(pod[-1]), pod, node, NOW - age, message)


STUCK = [
    # name, stuck pods, avoided before, reported before,
    #   -> avoided after, Event messages (start), recheck in
    ("nothing stuck", [], {}, {}, {}, [], None),
    ("too young: look again when it matures", [stuck(50)], {}, {}, {}, [], 10.5),
    ("the earliest maturity wins", [stuck(50), stuck(20, pod="chat-1")], {}, {}, {}, [], 10.5),
    ("old enough: avoid the node, say so", [stuck(61)], {}, {},
     {"ai/chat": {"n1": NOW + AVOID_SECONDS}},
     ["replica 0: the scheduler left pod chat-0 Unschedulable on node n1 for 61 s"], None),
    ("avoided already: extend, quietly", [stuck(120)], {"ai/chat": {"n1": NOW + 5}}, {},
     {"ai/chat": {"n1": NOW + AVOID_SECONDS}}, [], None),
    ("expired avoidances go", [], {"ai/chat": {"n1": NOW - 1, "n2": NOW + 1}}, {},
     {"ai/chat": {"n2": NOW + 1}}, [], None),
    ("a model with none left goes", [], {"ai/chat": {"n1": NOW}}, {}, {}, [], None),
    ("no node could help: report, keep the placement", [stuck(61, message=ANY_NODE)], {}, {},
     {}, ["replica 0: pod chat-0 cannot be scheduled on any node"], None),
    ("reported once", [stuck(61, message=ANY_NODE)], {}, {"chat-0": ANY_NODE}, {}, [], None),
    ("reported again when the message changes", [stuck(61, message=ANY_NODE + " (2)")], {},
     {"chat-0": ANY_NODE}, {}, ["replica 0: pod chat-0 cannot be scheduled on any node"], None),
]


@pytest.mark.parametrize(("pods", "avoid", "reported", "after", "says", "recheck"),
                         [s[1:] for s in STUCK], ids=[s[0] for s in STUCK])
def test_a_node_that_cannot_run_a_models_pod_is_avoided(
    pods: list[StuckPod], avoid: dict[str, dict[str, float]], reported: dict[str, str],
    after: dict[str, dict[str, float]], says: list[str], recheck: float | None,
) -> None:
    before = copy.deepcopy((avoid, reported))
    verdict = avoid_stuck(pods, avoid, reported, NOW, THRESHOLD)
    assert verdict.avoid == after
    messages = [e.message for e in verdict.events.get("ai/chat", [])]
    assert len(messages) == len(says) and all(
        m.startswith(s) for m, s in zip(messages, says, strict=True)), messages
    assert all(e.reason is EventReason.UNSCHEDULABLE and e.warning
               for e in verdict.events.get("ai/chat", []))
    assert verdict.recheck_in == recheck
    assert (avoid, reported) == before  # the inputs are not changed


# ---- Events --------------------------------------------------------------------------


def test_an_event_names_the_model_the_operator_and_the_replica_reporting_it() -> None:
    event = EventSpec(EventReason.REPLACING, "x" * 2000, warning=True)
    body = event_manifest(Involved("ai", "chat", "uid-chat"), event, "2026-12-01T00:00:00Z",
                          "replica-" + "r" * 200)
    assert body["involvedObject"] == {"apiVersion": API_VERSION, "kind": "LocalModel",
                                      "name": "chat", "namespace": "ai", "uid": "uid-chat"}
    assert body["metadata"] == {"generateName": "chat.", "namespace": "ai"}
    assert (body["reason"], body["type"], len(body["message"])) == ("ReplacingPod", "Warning",
                                                                     1024)
    assert body["source"] == {"component": "localmodel-operator"}
    assert body["reportingComponent"] == "localmodel.dev/operator"
    assert len(body["reportingInstance"]) == 128
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-12-01T00:00:00Z"
    normal = event_manifest(Involved("ai", "chat", "u"), EventSpec(EventReason.PLACED, "m"),
                            "t", "i")
    assert normal["type"] == "Normal"


# ---- a pass's plan --------------------------------------------------------------------

MEMORY = [
    # name, what the watches show, where the last pass put replicas, planned from
    ("nothing remembered", {"ai/chat": ["n1", None]}, {}, {"ai/chat": ["n1", None]}),
    ("a replica the watches do not show yet", {"ai/chat": ["n1", None]},
     {"ai/chat": {1: "n2"}}, {"ai/chat": ["n1", "n2"]}),
    ("the watches win over memory", {"ai/chat": ["n1", "n3"]}, {"ai/chat": {0: "n9", 1: "n2"}},
     {"ai/chat": ["n1", "n3"]}),
    ("a replica scaled away is not brought back", {"ai/chat": [None]},
     {"ai/chat": {0: "n1", 1: "n2"}}, {"ai/chat": ["n1"]}),
    ("a model gone is not brought back", {}, {"ai/chat": {0: "n1"}}, {}),
]


@pytest.mark.parametrize(("current", "placed", "want"), [m[1:] for m in MEMORY],
                         ids=[m[0] for m in MEMORY])
def test_a_pass_remembers_where_the_last_one_put_replicas(
    current: dict[str, list[str | None]], placed: dict[str, dict[int, str]],
    want: dict[str, list[str | None]],
) -> None:
    before = copy.deepcopy(current)
    assert with_memory(current, placed) == {k: tuple(v) for k, v in want.items()}
    assert current == before


def test_failed_writes_retry_later_each_time_and_report_only_what_changed() -> None:
    failures = Failures()
    steps = [
        # what failed this pass -> (retry in, Event message or None)
        (["HTTP 500: a"], (RETRY_SECONDS[0], "HTTP 500: a")),
        (["HTTP 500: a", "HTTP 500: a"], (RETRY_SECONDS[1], None)),  # said already
        (["HTTP 500: b", "HTTP 500: a"], (RETRY_SECONDS[2], "HTTP 500: a; HTTP 500: b")),
        ([], (None, None)),  # a clean pass forgets
        (["HTTP 500: a"], (RETRY_SECONDS[0], "HTTP 500: a")),
    ]
    for failed, (retry, message) in steps:
        retry_in, event = failures.after_pass("ai/chat", failed)
        assert (retry_in, event.message if event else None) == (retry, message), failed
        assert event is None or (event.reason is EventReason.FAILED and event.warning)
    assert failures.after_pass("ai/other", ["x"])[0] == RETRY_SECONDS[0]  # per model

def test_a_pod_created_seen_then_deleted_by_someone_else_is_created_again() -> None:
    """The real-node journey's finding: a pod deleted within EXPECT_SECONDS of
    its create, after the watches had shown it, waited minutes for a pass."""
    expected = Expectations()
    expected.wrote(CREATE, NOW)
    expected.forget_shown(world(pod=True), NOW + 1)  # a pass sees it; no change for it
    assert not expected.waiting(CREATE, world(), NOW + 2)  # deleted: create it again


def test_a_pass_forgets_only_the_writes_the_watches_show() -> None:
    expected = Expectations()
    expected.wrote(CREATE, NOW)
    expected.wrote(apply_with("h1"), NOW)
    expected.forget_shown(world(service_hash="h0"), NOW + 1)  # neither shown yet
    assert set(expected.by_target) == {CREATE.target, APPLY.target}
    expected.forget_shown(world(pod=True, service_hash="h0"), NOW + 1)
    assert set(expected.by_target) == {APPLY.target}
    expected.forget_shown(world(service_hash="h0"), NOW + EXPECT_SECONDS + 1)  # waited enough
    assert not expected.by_target
