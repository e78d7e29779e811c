"""A pass's writes, one model at a time (controller/reconcile.py `Reconciler._model`):
an exception while writing one model (not an API refusal: a bug, a manifest the
client cannot send) marks that model (an Event, the metric, a retry) and every
other model is written as usual; a model whose computation failed gets its
ReconcileFailed status and Event, once.

The API server is a stand-in here (`Recording`, in-process: it records what
the reconciler sends and raises for one model); the e2e tier runs the
reconciler against the real one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from localmodel.contract import LABEL_NAME
from localmodel.controller import model_work
from localmodel.controller.config import OperatorConfig
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.snapshot import Snapshot
from localmodel.controller.watched import WATCHED
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

NODES = [MakeNode(f"n{i}").cpu_flags({"AVX2"}).registered().manifest() for i in range(3)]


def model(name: str) -> dict[str, Any]:
    return (MakeLocalModel(name).uid(f"uid-{name}").generation(1)
            .spec(model="qwen3:0.6b", cpu=1, context=2048,
                  placement={"exclusive": False}).manifest())


class Recording:
    """Stand-in for controller.writer.Kube: records creates, applies and
    deletes; creating any object of model `broken` raises TypeError."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.created: list[Mapping[str, Any]] = []
        self.applied: list[tuple[Mapping[str, Any], str | None]] = []

    def _of(self, manifest: Mapping[str, Any]) -> str:
        if manifest.get("kind") == "Event":
            return str(manifest["involvedObject"]["name"])
        return str(((manifest.get("metadata") or {}).get("labels") or {}).get(LABEL_NAME, ""))

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if manifest.get("kind") != "Event" and self._of(manifest) == self.broken:
            raise TypeError("a manifest the client cannot send")
        self.created.append(manifest)
        return dict(manifest)

    async def apply(self, manifest: Mapping[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        self.applied.append((manifest, subresource))
        return dict(manifest)

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        return None


def reconciler(kube: Recording, names: list[str]) -> tuple[Reconciler, OperatorMetrics]:
    metrics = OperatorMetrics()
    rec = Reconciler(OperatorConfig(), kube, metrics)  # type: ignore[arg-type]
    snap = Snapshot(localmodels=[model(n) for n in names], nodes=NODES)
    by_name = {w.name: list(getattr(snap, w.name)) for w in WATCHED}
    for name, items in by_name.items():
        rec.sources[name] = lambda items=items: items  # type: ignore[misc]
    return rec, metrics


def pods_created(kube: Recording) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in kube.created:
        if m.get("kind") == "Pod":
            name = m["metadata"]["labels"][LABEL_NAME]
            out[name] = out.get(name, 0) + 1
    return out


def events(kube: Recording, reason: str) -> list[str]:
    return [str(m["involvedObject"]["name"]) for m in kube.created
            if m.get("kind") == "Event" and m["reason"] == reason]


def test_an_exception_writing_one_model_leaves_the_others_written() -> None:
    names = ["a", "b", "c", "d"]
    alone = Recording(broken="")
    with_broken = Recording(broken="b")

    async def both() -> tuple[Any, Any]:
        first, _ = reconciler(alone, names)
        second, metrics = reconciler(with_broken, names)
        return await first.reconcile_once(), (await second.reconcile_once(), metrics)

    _, (result, metrics) = asyncio.run(both())
    assert pods_created(with_broken) == {n: c for n, c in pods_created(alone).items()
                                         if n != "b"}
    assert set(pods_created(alone)) == set(names)
    assert events(with_broken, "ReconcileFailed") == ["b"]
    assert metrics.model_failures.values == {("write",): 1.0}
    assert result.failures >= 1
    # The other models' statuses were written; b's was not reached.
    statuses = {m["metadata"]["name"] for m, sub in with_broken.applied if sub == "status"}
    assert statuses == {"a", "c", "d"}


def test_a_model_that_failed_to_compute_gets_its_status_and_one_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = model_work.model_changes

    def changes(result: Any, uid: str, obs: Any, idle: Any = None) -> Any:
        if result.model.metadata.name == "b":
            raise KeyError("a bug in the changes")
        return real(result, uid, obs, idle)

    monkeypatch.setattr(model_work, "model_changes", changes)
    kube = Recording(broken="")

    async def twice() -> OperatorMetrics:
        rec, metrics = reconciler(kube, ["a", "b"])
        await rec.reconcile_once()
        await rec.reconcile_once()
        return metrics

    metrics = asyncio.run(twice())
    assert set(pods_created(kube)) == {"a"}
    assert events(kube, "ReconcileFailed") == ["b"]  # once, not once per pass
    assert metrics.model_failures.values == {("compute",): 2.0}
    [status] = [m["status"] for m, sub in kube.applied
                if sub == "status" and m["metadata"]["name"] == "b"][:1]
    [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "ReconcileFailed" and "KeyError" in ready["message"]
