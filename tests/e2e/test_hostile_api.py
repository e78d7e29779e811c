"""The API server agrees: every bad manifest it can see is refused naming the same field.

The table is `tests/corpus.py`, the offline side is `tests/api/test_hostile.py`.
Here each case that is a single JSON object (`api` is not None) is POSTed to a
real kube-apiserver with the generated CRD, as `kubectl apply` sends it
(`fieldValidation=Strict`, kubectl's default), and the refusal must contain what
the case says, normally the very field path the offline error names. A case the
API server stores (`api == ACCEPTED`) must be one that the operator's pure path,
`parse_local_model` on the object the API server returns plus `desired_state`,
marks `Valid=False` with the same field, rendering nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from localmodel.api import parse_local_model
from localmodel.desired import desired_state
from localmodel.errors import InvalidObject
from tests.builders import MakeNode
from tests.corpus import ACCEPTED, CORPUS, Bad
from tests.fuzz import EXAMPLES, manifests
from tests.harness import TestCluster

pytestmark = pytest.mark.e2e

REACHES_API = [c for c in CORPUS if c.api is not None]
NODE = MakeNode("n1").facts()
FUZZ_NODES = [NODE, MakeNode("n2").cpus(8).memory_gib(32).facts()]
NOW = "2026-12-01T00:00:00Z"
PLURALS = {
    "ConfigMap": "configmaps",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Pod": "pods",
    "Service": "services",
}


def post(
    cluster: TestCluster, base: str, ns: str, body: dict[str, Any], *, dry_run: bool = False
) -> tuple[int, Any]:
    # kubectl apply's defaults: unknown fields are an error, not silently pruned.
    path = f"{base}/namespaces/{ns}/localmodels?fieldValidation=Strict"
    if dry_run:
        path += "&dryRun=All"
    return cluster.api().request("POST", path, body)


def test_the_table_covers_every_class_the_api_server_can_see() -> None:
    assert len(REACHES_API) >= 50
    # Only what needs the catalog, or the time zone database (spec.idle's timeZone).
    assert sum(c.api == ACCEPTED for c in REACHES_API) == 2


@pytest.mark.parametrize("case", REACHES_API, ids=[c.id for c in REACHES_API])
def test_the_api_server_refuses_what_render_refuses(
    cluster: TestCluster, crd: str, namespace: str, case: Bad
) -> None:
    body = case.body()
    status, answer = post(cluster, crd, namespace, body)
    message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
    if case.api != ACCEPTED:
        assert status in (400, 422), f"the API server stored {case.id}: {status} {message}"
        assert case.api is not None and case.api in message, message
        return
    assert status == 201, message
    # Stored: the operator reads what the API server returns and must say Valid=False.
    try:
        model = parse_local_model(answer)
    except InvalidObject as e:  # pragma: no cover - would mean the two disagree on the schema
        pytest.fail(f"the API server stored {case.id}, which parse_local_model refuses: {e}")
    result = desired_state([model], [NODE], now=NOW).models[0]
    valid = next(c for c in result.status.conditions if c.type == "Valid")
    assert valid.status.value == "False"
    assert valid.message.startswith(f"{case.field}: "), valid.message
    assert case.words in valid.message
    assert result.objects == ()


# ---- fuzzed: Python and the API server accept and refuse the same manifests -------------

API_EXAMPLES = max(20, EXAMPLES // 3)


def _as_applied(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The manifest as it reaches the API server: in the test namespace, with no status
    (ignored on create) and no unknown metadata fields (Python passes them through)."""
    body = {k: v for k, v in body.items() if k != "status"}
    if isinstance(body.get("metadata"), dict):
        meta = {k: v for k, v in body["metadata"].items() if k in ("name", "labels", "uid")}
        body["metadata"] = meta | {"namespace": namespace}
    return body


@settings(
    max_examples=API_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=manifests)
def test_python_and_the_api_server_agree_on_fuzzed_manifests(
    cluster: TestCluster, crd: str, namespace: str, body: dict[str, Any]
) -> None:
    body = _as_applied(body, namespace)
    try:
        parse_local_model(body)
    except InvalidObject as e:
        status, answer = post(cluster, crd, namespace, body, dry_run=True)
        assert status in (400, 422), f"render refuses ({e}) but the API server stores it"
        event("refused by both")
        return
    status, answer = post(cluster, crd, namespace, body, dry_run=True)
    assert status == 201, f"render accepts, the API server refuses: {answer.get('message')}"
    # What the operator would create from the stored object, the API server accepts too.
    result = desired_state([parse_local_model(answer)], FUZZ_NODES, now=NOW).models[0]
    event(f"accepted by both, {len(result.objects)} objects rendered")
    api = cluster.api()
    for obj in result.objects:
        kind = obj["kind"]
        path = f"/api/v1/namespaces/{namespace}/{PLURALS[kind]}?dryRun=All&fieldValidation=Strict"
        code, reply = api.request("POST", path, obj)
        assert code == 201, f"{kind} {obj['metadata']['name']}: {reply.get('message')}"
