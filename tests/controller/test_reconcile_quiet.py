"""The reconciler's passes once nothing changed (controller/reconcile.py): a
model whose very same work needed no write is not looked at again, which must
never hide a write that is needed. Here the writes show in the watches' indexes
as the API server's watch events would: a status written replaces the stored
LocalModel. Once settled, a pass writes nothing; a status someone else changed
is written back on the next pass; an edited model is written for at once.

The API server is a stand-in here (`Store`, in-process: it keeps what the
reconciler writes); the e2e tier runs the reconciler against the real one."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from localmodel.contract import ANNOTATION_NODE
from localmodel.controller.config import OperatorConfig
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.watch_shape import plain
from localmodel.controller.watched import WATCHED
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

KINDS = {"Pod": "pods", "PersistentVolumeClaim": "claims", "ConfigMap": "configmaps",
         "Service": "services", "NetworkPolicy": "networkpolicies"}


class Store:
    """Stand-in for controller.writer.Kube and the watches' indexes: what is
    created, applied or deleted shows in `stores` (uid -> object, per watch)."""

    def __init__(self) -> None:
        self.stores: dict[str, dict[str, dict[str, Any]]] = {w.name: {} for w in WATCHED}
        self.writes: list[tuple[str, str]] = []  # (verb, kind)
        self.rv = 0

    def put(self, name: str, body: dict[str, Any]) -> None:
        self.rv += 1
        meta = body["metadata"]
        uid = meta.get("uid") or f"uid-{name}-{meta['namespace']}-{meta['name']}"
        body["metadata"] = {**meta, "uid": uid, "resourceVersion": str(self.rv)}
        keep = next(w for w in WATCHED if w.name == name).keep
        self.stores[name][uid] = keep(body)

    def model(self, name: str) -> dict[str, Any]:
        """The stored model as plain JSON (the store holds what the watch keeps)."""
        return plain(next(b for b in self.stores["localmodels"].values()
                          if b["metadata"]["name"] == name))

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("create", str(manifest["kind"])))
        if manifest["kind"] in KINDS:
            body = copy.deepcopy(dict(manifest))
            if body["kind"] == "Pod":
                body["spec"]["nodeName"] = body["metadata"]["annotations"][ANNOTATION_NODE]
                body["status"] = {"phase": "Running",
                                  "conditions": [{"type": "Ready", "status": "True"}]}
            self.put(KINDS[body["kind"]], body)
        return dict(manifest)

    async def apply(self, manifest: Mapping[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        self.writes.append(("apply", str(manifest["kind"]) + (f"/{subresource}"
                                                               if subresource else "")))
        if subresource == "status":
            old = self.model(manifest["metadata"]["name"])
            self.put("localmodels", {**old, "status": copy.deepcopy(manifest["status"])})
        return dict(manifest)

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        self.writes.append(("delete", str(args[0])))


def reconciler(store: Store) -> Reconciler:
    rec = Reconciler(OperatorConfig(), store, OperatorMetrics(),  # type: ignore[arg-type]
                     clock=lambda: 1767225600.0)
    for name, kept in store.stores.items():
        rec.sources[name] = kept.values  # (as handlers.py: the index's objects, each pass)
    return rec


def model(name: str, replicas: int = 1) -> dict[str, Any]:
    return (MakeLocalModel(name).uid(f"uid-{name}").generation(1)
            .spec(model="qwen3:0.6b", cpu=1, context=2048, replicas=replicas,
                  placement={"exclusive": False}).manifest())


def settled(store: Store, rec: Reconciler) -> None:
    for _ in range(6):
        before = len(store.writes)
        asyncio.run(rec.reconcile_once())
        if len(store.writes) == before:
            return
    raise AssertionError(f"still writing after 6 passes: {store.writes[-10:]}")


def test_a_settled_operator_writes_nothing_and_writes_back_what_someone_changed() -> None:
    store = Store()
    for i in range(3):
        store.put("nodes", MakeNode(f"n{i}").cpu_flags({"AVX2"}).registered().manifest())
    for name in ("a", "b"):
        store.put("localmodels", model(name))
    rec = reconciler(store)
    settled(store, rec)
    made = len(store.writes)
    assert ("create", "Pod") in store.writes and ("apply", "LocalModel/status") in store.writes
    asyncio.run(rec.reconcile_once())
    asyncio.run(rec.reconcile_once())
    assert len(store.writes) == made  # quiet passes: nothing

    # Someone else overwrote model a's status: the next pass writes it back.
    theirs = store.model("a")
    store.put("localmodels", {**theirs, "status": {"conditions": []}})
    asyncio.run(rec.reconcile_once())
    assert ("apply", "LocalModel/status") in store.writes[made:]
    assert {kind for _, kind in store.writes[made:]} <= {"LocalModel/status", "Event"}
    assert store.model("a")["status"]["conditions"], "the status was not written back"

    # Someone deleted b's pod: it is made again.
    made = len(store.writes)
    pod = next(u for u, p in store.stores["pods"].items()
               if p["metadata"]["name"].startswith("b-"))
    del store.stores["pods"][pod]
    asyncio.run(rec.reconcile_once())
    assert ("create", "Pod") in store.writes[made:]

    # Model a edited to two replicas: a second pod at once.
    made = len(store.writes)
    edited = copy.deepcopy(store.model("a"))
    edited["spec"]["replicas"] = 2
    edited["metadata"]["generation"] = 2
    store.put("localmodels", edited)
    asyncio.run(rec.reconcile_once())
    assert store.writes[made:].count(("create", "Pod")) == 1
    settled(store, rec)


class LaggingStore(Store):
    """The status writes are taken but the watch has not shown them yet."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[str] = []  # each status written, as JSON

    async def apply(self, manifest: Mapping[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        if subresource == "status":
            self.statuses.append(json.dumps(manifest["status"], sort_keys=True))
            return dict(manifest)
        return await super().apply(manifest, subresource)


def test_a_status_written_is_not_written_again_until_the_watch_shows_another() -> None:
    """The reconciler remembers each status it wrote (by the stored version it
    saw and a digest of the body): while the watch still shows that version,
    the same status is not written again; once the stored object is another
    version (someone changed it), the status is written again."""
    store = LaggingStore()
    store.put("nodes", MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest())
    store.put("localmodels", model("a"))
    rec = reconciler(store)
    for _ in range(5):
        asyncio.run(rec.reconcile_once())
    assert store.statuses and len(set(store.statuses)) == len(store.statuses), store.statuses
    written = len(store.statuses)
    store.put("localmodels", store.model("a"))  # a new version, the status still not shown
    asyncio.run(rec.reconcile_once())
    assert len(store.statuses) == written + 1 and store.statuses[-1] == store.statuses[-2]


def test_a_settled_models_work_holds_its_stored_status_not_a_copy() -> None:
    """Memory at 5 000 models (issue 33): once the stored status says what the
    operator works out, the pass keeps the stored objects, not equal copies."""
    from localmodel.controller.parse_memo import Parsed
    from localmodel.controller.plan import plan_pass
    from localmodel.controller.snapshot import observe
    from localmodel.incremental import Desired
    from localmodel.status import status_changed

    store = Store()
    store.put("nodes", MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest())
    store.put("localmodels", model("a"))
    rec = reconciler(store)
    settled(store, rec)
    obs = observe(rec.snapshot(), (), Parsed())
    plan = plan_pass(obs, "2026-01-01T00:00:00Z", rec._render_options, placed={}, avoid={},
                     desired=Desired())
    [work] = plan.work
    assert work.model.status is not None and work.status is work.model.status
    assert not status_changed(work.model.status, work.status)
    assert work.model.model is not None and work.model.model.status is work.model.status


def test_a_label_change_that_moves_a_model_is_written_in_that_pass() -> None:
    """A settled reconciler goes through only the work that is not the last
    plan's (`PassPlan.since`): a node relabelled so that a model's nodeSelector
    no longer matches it gets that model moved in the label's own pass (its pod
    there deleted, its status placing it on a node that matches)."""
    store = Store()
    for i in range(3):
        store.put("nodes", MakeNode(f"n{i}").cpu_flags({"AVX2"}).labels(pool="a")
                  .registered().manifest())
    picky = model("picky")
    picky["spec"]["placement"]["nodeSelector"] = {"pool": "a"}
    store.put("localmodels", picky)
    store.put("localmodels", model("other"))
    rec = reconciler(store)
    settled(store, rec)
    asyncio.run(rec.reconcile_once())  # quiet
    made = len(store.writes)
    pod = next(p for p in store.stores["pods"].values()
               if p["metadata"]["name"].startswith("picky-"))
    node = pod["spec"]["nodeName"]
    uid = next(u for u, n in store.stores["nodes"].items() if n["metadata"]["name"] == node)
    relabel = copy.deepcopy(plain(store.stores["nodes"][uid]))
    relabel["metadata"]["labels"]["pool"] = "b"
    store.put("nodes", relabel)
    asyncio.run(rec.reconcile_once())
    # (its pod there deleted first; the new one once the watch shows it gone)
    assert ("delete", "Pod") in store.writes[made:]
    assert ("apply", "LocalModel/status") in store.writes[made:]
    assert store.model("picky")["status"]["placements"][0]["node"] != node
