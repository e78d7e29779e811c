"""The operator reads a refused write from the API server's Status (code and
`details.causes`), never from its message: these are the real server's answers
to the operator's own writer, classified by `controller/refused.py`.

A namespace held in Terminating (a ConfigMap in it keeps a finalizer) refuses
every create with the NamespaceLifecycle admission's cause; a second create of
one object conflicts; a delete of a missing one is not found.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from localmodel.controller.refused import Refusal, refusal
from localmodel.controller.writer import Kube, KubeError
from localmodel.kube import Credentials
from tests.harness import ADMIN, TestCluster
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e


def config_map(namespace: str, name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, **meta}, "data": {"a": "b"}}


async def refused(kube: Kube, manifest: dict[str, Any]) -> Refusal:
    try:
        await kube.create(manifest)
    except KubeError as exc:
        return refusal(exc.status, exc.causes)
    raise AssertionError(f"{manifest['metadata']['name']} was created")


async def test_the_real_servers_refusals_are_classified_by_code_and_cause(
    cluster: TestCluster,
) -> None:
    api = cluster.api()
    ns = f"e2e-ending-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    held = f"/api/v1/namespaces/{ns}/configmaps/held"
    api.create(f"/api/v1/namespaces/{ns}/configmaps",
               config_map(ns, "held", finalizers=["e2e.localmodel.dev/hold"]))
    creds = Credentials(server=cluster.server, ca_file=str(cluster.ca_file),
                        token=cluster.identities[ADMIN].token)
    try:
        async with Kube(creds) as kube:
            await kube.create(config_map(ns, "once"))
            assert await refused(kube, config_map(ns, "once")) is Refusal.CONFLICT
            with pytest.raises(KubeError) as gone:
                await kube.delete("ConfigMap", ns, "never-made")
            assert refusal(gone.value.status, gone.value.causes) is Refusal.NOT_FOUND

            api.request("DELETE", f"/api/v1/namespaces/{ns}")

            def terminating() -> bool:
                _, body = api.request("GET", f"/api/v1/namespaces/{ns}")
                return (body.get("status") or {}).get("phase") == "Terminating"

            wait_until(f"namespace {ns} to be Terminating", terminating, timeout=30)
            assert await refused(kube, config_map(ns, "late")) is Refusal.NAMESPACE_ENDING
            event = {"apiVersion": "v1", "kind": "Event",
                     "metadata": {"generateName": "x.", "namespace": ns},
                     "involvedObject": {"kind": "ConfigMap", "name": "held", "namespace": ns},
                     "reason": "Test", "message": "m", "type": "Normal"}
            assert await refused(kube, event) is Refusal.NAMESPACE_ENDING
    finally:
        api.merge_patch(held, {"metadata": {"finalizers": None}})
        api.request("DELETE", f"/api/v1/namespaces/{ns}")
