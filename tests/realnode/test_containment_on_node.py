"""Containment on the real node: one tenant's lying gateway stays that tenant's problem.

Tenant A's LocalModel runs on the real node with the real llama-server engine
and a gateway image of its own choosing (`spec.gateway.image`), built here
(tests/realnode/hostile_image.py: the operator image with a hostile /speed
server in place of `localmodel gateway`). Each read of its /speed gets the next
hostile answer: a 1e999 counter, "[" * 60000, a NaN and an Infinity
calibration, a redirect to an address of the tenant's choosing, a stall, an
endless body and one announcing 10^12 bytes (hostile_speed_server.ANSWERS).
Meanwhile tenant B's model (on a kwok node) is applied, edited and deleted and
converges as usual. Throughout, the operator's pods never restart, the Lease
keeps its holder and its transitions, the redirect is never followed, the
hostile replica's status carries no speed, and the operator counts the reads
as bad answers (`localmodel_operator_gateway_reads_total{result="bad_answer"}`),
exactly one per hostile answer served (the stall: a timeout); tenant B's model
runs without a gateway, so no other replica is read."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localmodel.contract import LABEL_NAME
from localmodel.controller.config import OperatorConfig
from localmodel.engines import llama_server
from localmodel.gateway_contract import GATEWAY_PORT
from tests.builders import MakeLocalModel
from tests.harness.chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.engines import CHAT_TEMPLATE_ENV, MODEL_TAG
from tests.harness.images import list_images
from tests.harness.processes import wait_for
from tests.realnode import hostile_image
from tests.realnode.conftest import VOLUMES, VOLUMES_DIR
from tests.realnode.hostile_speed_server import ANSWERS
from tests.realnode.journey import (
    OPERATOR_LEASE,
    Journey,
    Manifest,
    condition,
    http_json,
    local_volumes,
)

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

HOSTILE_NS, OTHER_NS = "tenant-a", "tenant-b"
HOSTILE, OTHER = "liar", "bystander"
OTHER_NODE = "avx2-0"  # a kwok node of the fixture (tests/fixtures/nodes.yaml)
METRICS_PORT = OperatorConfig.metrics_listen[1]
BAD = tuple(a for a in ANSWERS if a != "stall")  # every answer but the stall is a bad one


def lm_path(namespace: str, name: str = "") -> str:
    return f"/apis/localmodel.dev/v1alpha1/namespaces/{namespace}/localmodels" + (
        f"/{name}" if name else "")


def pods_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_NAME}={name}"


def reads(journey: Journey) -> dict[str, float]:
    """localmodel_operator_gateway_reads_total by result, summed over the operator's pods."""
    out: dict[str, float] = {}
    for pod in journey.operator_pods():
        text = journey.scrape(CHART_NAMESPACE, pod["metadata"]["name"], METRICS_PORT)
        for m in re.finditer(r'^localmodel_operator_gateway_reads_total\{result="(\w+)"\} (\S+)$',
                             text, re.M):
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def operators(journey: Journey) -> dict[str, tuple[str, int]]:
    """Each operator pod: (uid, restarts of its containers)."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], sum(
        s["restartCount"] for s in p["status"].get("containerStatuses") or []))
        for p in journey.operator_pods()}


def lease(journey: Journey) -> tuple[str, int]:
    spec = journey.get(OPERATOR_LEASE)["spec"]
    return str(spec["holderIdentity"]), int(spec.get("leaseTransitions") or 0)


def model(journey: Journey, name: str, namespace: str, node: str, **spec: Any) -> Manifest:
    return (MakeLocalModel(name, namespace).model(MODEL_TAG).engine(llama_server.NAME)
            .gguf(journey.model_file_url(), journey.sha256).cpu(1).context(1024)
            .spec(placement={"nodeSelector": {"kubernetes.io/hostname": node},
                             "exclusive": False},
                  storage={"storageClassName": "local-disk"},
                  env=[{"name": k, "value": v} for k, v in CHAT_TEMPLATE_ENV.items()], **spec)
            .manifest())


def ready_pod(journey: Journey, namespace: str, name: str, not_uid: str = "") -> Manifest | None:
    for p in journey.get(pods_path(namespace, name))["items"]:
        if (not p["metadata"].get("deletionTimestamp") and p["metadata"]["uid"] != not_uid
                and condition(p, "Ready") == "True"):
            return dict(p)
    return None


def converged(journey: Journey, namespace: str, name: str) -> bool:
    lm = journey.get(lm_path(namespace, name))
    status = lm.get("status") or {}
    return (status.get("observedGeneration") == lm["metadata"]["generation"]
            and condition(lm, "Ready") == "True")


@pytest.fixture(scope="module")
def tenants(journey: Journey) -> Iterator[str]:
    """Both tenants' namespaces, the hostile image in the test registry (the node
    pulls it, as every image) and a volume for tenant A's weights; the hostile
    gateway's base URL is not known yet: yields the image reference."""
    assert journey.cluster.registry is not None
    [operator] = list_images("operator")
    archive = hostile_image.build(operator.archive,
                                  journey.cluster.workdir / "hostile-gateway.oci.tar")
    reference = journey.cluster.registry.push_archive(archive, hostile_image.REFERENCE)
    api = journey.cluster.api()
    for ns in (HOSTILE_NS, OTHER_NS):
        api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        wait_for(f"{ns}'s default ServiceAccount", lambda ns=ns: api.status_of(
            "GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default") == 200, 30)
    journey.cluster.apply(local_volumes(journey.node, 1, VOLUMES_DIR, first=VOLUMES + 10))
    try:
        yield reference
    finally:
        for ns, name in ((HOSTILE_NS, HOSTILE), (OTHER_NS, OTHER)):
            api.status_of("DELETE", lm_path(ns, name))
        for ns, name in ((HOSTILE_NS, HOSTILE), (OTHER_NS, OTHER)):
            wait_for(f"{name}'s pods gone", lambda ns=ns, name=name: not journey.get(
                pods_path(ns, name))["items"], 180, interval=1)


def why(journey: Journey) -> None:
    """Tenant B's model, pods and Events, and the operator's log, printed."""
    print(json.dumps(journey.get(lm_path(OTHER_NS, OTHER)).get("status"), indent=1)[-4000:])
    print(journey.kubectl("get", "pods,pvc,events", "-n", OTHER_NS, "-o", "wide",
                          check=False)[-4000:])
    print(journey.kubectl("logs", "-n", CHART_NAMESPACE, "-l", "!app.kubernetes.io/component",
                          "--tail=60", "--prefix", check=False)[-8000:])


def other_tenant_lifecycle(journey: Journey) -> dict[str, float]:
    """Tenant B's model applied, edited (a new context: its pod is replaced) and
    deleted, each step converging; the time each took."""
    api, took = journey.cluster.api(), {}
    began = time.monotonic()
    # Without a gateway: its kwok pod's made-up IP is then never read, and every
    # read the operator counts is the hostile replica's.
    api.create(lm_path(OTHER_NS), model(journey, OTHER, OTHER_NS, OTHER_NODE,
                                        gateway={"enabled": False}))
    try:
        wait_for("tenant B's model Ready", lambda: converged(journey, OTHER_NS, OTHER), 180,
                 interval=0.5)
    finally:
        took["applied -> Ready"] = time.monotonic() - began
        if took["applied -> Ready"] > 20:  # say why, for the record
            why(journey)
    first = ready_pod(journey, OTHER_NS, OTHER)
    assert first is not None
    began = time.monotonic()
    api.merge_patch(lm_path(OTHER_NS, OTHER), {"spec": {"context": 2048}})
    wait_for("tenant B's edited model Ready on a new pod", lambda: converged(
        journey, OTHER_NS, OTHER) and ready_pod(journey, OTHER_NS, OTHER,
                                                not_uid=first["metadata"]["uid"]), 240,
             interval=0.5)
    placements = journey.get(lm_path(OTHER_NS, OTHER))["status"]["placements"]
    assert "-c 2048" in placements[0]["settings"]["args"], placements
    took["edited -> Ready again"] = time.monotonic() - began
    began = time.monotonic()
    api.delete(lm_path(OTHER_NS, OTHER))
    wait_for("tenant B's model and pods gone", lambda: not journey.get(pods_path(
        OTHER_NS, OTHER))["items"] and api.status_of("GET", lm_path(OTHER_NS, OTHER)) == 404,
        180, interval=0.5)
    took["deleted -> gone"] = time.monotonic() - began
    return took


def test_a_lying_gateway_costs_the_operator_nothing(journey: Journey, tenants: str) -> None:
    journey.operator_settled(timeout=300)
    before_pods, before_lease = operators(journey), lease(journey)
    before = reads(journey)
    api = journey.cluster.api()
    began = time.monotonic()
    api.create(lm_path(HOSTILE_NS), model(journey, HOSTILE, HOSTILE_NS, journey.node,
                                          gateway={"image": tenants}))
    pod = wait_for("tenant A's pod Ready (the hostile gateway answers its probes)",
                   lambda: ready_pod(journey, HOSTILE_NS, HOSTILE), 600, interval=1)
    journey.timings.add("containment: hostile model created -> pod Ready",
                        time.monotonic() - began)
    url = f"http://{pod['status']['podIP']}:{GATEWAY_PORT}"

    def hits() -> dict[str, int]:
        status, body = http_json(f"{url}/hits", timeout=10)
        assert status == 200, body
        return dict(body)

    wait_for("the operator's first read of the hostile gateway", lambda: sum(
        hits()[a] for a in ANSWERS) >= 1, 120, interval=1)
    at_start = hits()
    # Tenant B's model goes through its life again and again until every hostile
    # answer was served (about one read per --speed-idle-interval).
    lives: list[dict[str, float]] = []
    deadline = time.monotonic() + 900
    while not all(hits()[a] >= 1 for a in ANSWERS) or len(lives) < 2:
        assert time.monotonic() < deadline, f"hostile answers served: {hits()}"
        lives.append(other_tenant_lifecycle(journey))
    served = hits()
    bad_served = sum(served[a] for a in BAD)
    for step in lives[0]:
        journey.timings.add(f"containment: tenant B {step} (slowest of {len(lives)})",
                            max(life[step] for life in lives))
    wait_for("the operator to count every bad answer served", lambda: reads(journey).get(
        "bad_answer", 0) - before.get("bad_answer", 0) >= bad_served, 60, interval=1)
    after = reads(journey)
    # Every bad answer counted is one the hostile replica served (reads go on
    # meanwhile: between the two looks at what it served).
    assert after["bad_answer"] - before.get("bad_answer", 0) <= sum(hits()[a] for a in BAD)
    print(f"hostile answers served {served} (at the first life of tenant B's model: "
          f"{at_start}); the operator's reads before {before}, after {after}; tenant B's "
          f"model went through {len(lives)} lives: {lives}")
    assert sum(served[a] - at_start[a] for a in ANSWERS) >= len(ANSWERS) - 1
    assert served["followed"] == 0, served  # the redirect was never followed
    assert after.get("timeout", 0) - before.get("timeout", 0) >= served["stall"] >= 1
    assert after.get("ok", 0) == before.get("ok", 0), (before, after)
    # The operator never restarted and never changed hands.
    assert operators(journey) == before_pods, (before_pods, operators(journey))
    assert all(restarts == 0 for _, restarts in before_pods.values()), before_pods
    assert lease(journey) == before_lease
    leaders = [p["metadata"]["name"] for p in journey.operator_pods() if any(
        line == "localmodel_operator_leader 1" for line in journey.scrape(
            CHART_NAMESPACE, p["metadata"]["name"], METRICS_PORT).splitlines())]
    assert len(leaders) == 1, leaders
    # Nothing of the lies reached tenant A's status; its model is still served.
    lm = journey.get(lm_path(HOSTILE_NS, HOSTILE))
    placements = lm["status"]["placements"]
    assert all(p.get("speed") is None for p in placements), placements
    assert condition(lm, "Ready") == "True", json.dumps(lm["status"])[:2000]
