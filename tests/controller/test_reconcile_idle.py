"""The reconciler's idle I/O around a pass (controller/reconcile.py): each pass
gets `IdleSignals` (the routers' held requests, the closes' answers, each
replica's last activity reading, whether a router runs), sends the closes the
pass asks for, tells the closer which answers and leases to keep, and looks
again within `wakers.RECHECK_S` while a model has an idle state. A model due to
sleep is asked to close; once it did, its pod goes and its status reads
Asleep. The API server is the in-process stand-in of test_reconcile_quiet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import MappingProxyType

import pytest

from localmodel.controller.config import OperatorConfig
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.reconcile import Reconciler
from localmodel.idle.asks import CloseAsk, Closed, CloseResult
from localmodel.idle.wakers import RECHECK_S
from localmodel.speed import Activity, Rates, Reading, Totals
from tests.builders import MakeLocalModel, MakeNode
from tests.controller.test_reconcile_quiet import Store, settled

pytestmark = pytest.mark.unit

NOW = 1767225600.0


class SecretStore(Store):
    """The stand-in, also reading Secrets: the router's signing key is not
    there yet (the reconciler makes it)."""

    async def get(self, path: str) -> None:
        return None


class Recorded(Reconciler):
    """A reconciler whose idle I/O is recorded: the closes it sends, the
    answers it keeps, the passes it asks for."""

    def __init__(self, store: Store, router: bool = True) -> None:
        config = OperatorConfig(router_namespace="localmodel" if router else "")
        super().__init__(config, store, OperatorMetrics(),  # type: ignore[arg-type]
                         clock=lambda: NOW)
        for name, kept in store.stores.items():
            self.sources[name] = kept.values
        self.sent: list[CloseAsk] = []
        self.kept: list[frozenset[str]] = []
        self.later: list[float] = []
        self.answers: dict[str, Closed] = {}
        self.closer.send = self.sent.extend  # type: ignore[method-assign]
        self.closer.retain = self._retain  # type: ignore[method-assign]
        self.closer.closes = lambda: MappingProxyType(dict(self.answers))  # type: ignore[method-assign]

    def _retain(self, pods: Iterable[str]) -> None:
        self.kept.append(frozenset(pods))

    def trigger_later(self, seconds: float) -> None:
        self.later.append(seconds)


def sleeper() -> Store:
    store = SecretStore()
    store.put("nodes", MakeNode("n0").cpu_flags({"AVX2"}).registered().manifest())
    store.put("localmodels", MakeLocalModel("q").uid("uid-q").generation(1).spec(
        model="qwen3:0.6b", cpu=1, context=2048,
        idle={"after": "1m", "release": "WhenAsleep"}).manifest())
    return store


def quiet(rec: Reconciler, idle_s: float) -> None:
    reading = Reading(NOW, Rates(), Totals(), activity=Activity(idle_seconds=idle_s))
    rec.speed.readings_by_model = lambda: {"ai/q": {0: reading}}  # type: ignore[method-assign]


def test_a_due_model_is_asked_to_close_and_released_once_it_did() -> None:
    store = sleeper()
    rec = Recorded(store)
    quiet(rec, 5)
    settled(store, rec)
    assert rec.sent == [] and RECHECK_S in rec.later  # (the signing key asks for its own)
    quiet(rec, 120)  # quiet for longer than `after`
    asyncio.run(rec.reconcile_once())
    assert [(a.pod, a.reason, a.idle_at_least) for a in rec.sent] == [("q-0", "sleep", 60)]
    rec.answers["ai/q-0"] = Closed(rec.sent[0], CloseResult.CLOSED, NOW, lease_seconds=60)
    made = len(store.writes)
    asyncio.run(rec.reconcile_once())
    assert ("delete", "Pod") in store.writes[made:]
    assert rec.kept[-1] == {"ai/q-0"}  # its close is renewed while its pod goes
    idle = store.model("q")["status"]["idle"]
    assert (idle["state"], idle["resident"]) == ("Asleep", False)


def test_without_a_router_nothing_is_asked_and_the_model_stays_awake() -> None:
    store = sleeper()
    rec = Recorded(store, router=False)
    quiet(rec, 120)
    settled(store, rec)
    assert rec.sent == []
    assert store.model("q")["status"]["idle"]["state"] == "Awake"
    awake = next(c for c in store.model("q")["status"]["conditions"] if c["type"] == "Awake")
    assert awake["reason"] == "RouterOff"
