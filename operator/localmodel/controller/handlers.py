"""kopf glue only: watches feed in-memory indexes and wake the reconciler.

No handler plans, renders or writes. kopf indexes are used (rather than a
store filled by event handlers) because kopf fills every index from its
initial listing *before* any other handler runs: the first trigger, and so the
first pass, sees the whole cluster, never a half-listed one that would make the
planner move models off nodes it has not seen yet. What is watched, and what
each index keeps, is the table in `watched.py`: one index and one trigger per
row. kopf's own writes are all off: no progress annotations or finalizers
(no change handlers), no posting of log messages as Events, no peering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from localmodel.contract import KOPF_ANNOTATIONS_PREFIX, KOPF_DIFFBASE_KEY, KOPF_FINALIZER
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.watched import WATCHED, Watched
from localmodel.kube import Credentials


def _values(index: kopf.Index[Any, Any]) -> Iterable[Mapping[str, Any]]:
    for store in index.values():
        yield from store


def _reader(index: kopf.Index[Any, Any]) -> Callable[[], Iterable[Mapping[str, Any]]]:
    return lambda: _values(index)


def _index(w: Watched, registry: kopf.OperatorRegistry) -> None:
    """One in-memory index per watched resource: uid -> what `w.keep` keeps."""

    async def keep(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: w.keep(body)}

    kopf.index(w.group, w.version, w.plural, labels=w.labels, registry=registry,
               id=w.index_id)(keep)


def build_registry(reconciler: Reconciler, creds: Credentials) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    # Every handler is async: kopf runs sync ones in threads, and the reconciler's
    # trigger is an asyncio primitive of this loop.
    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # the reconciler posts its own Events
        settings.scanning.disabled = True  # fixed resources: no CRD/namespace scanning
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=KOPF_ANNOTATIONS_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=KOPF_ANNOTATIONS_PREFIX, key=KOPF_DIFFBASE_KEY)
        settings.persistence.finalizer = KOPF_FINALIZER
        settings.watching.server_timeout = 270
        settings.watching.client_timeout = 300
        settings.networking.request_timeout = 60

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=creds.server,
            ca_path=creds.ca_file,
            insecure=creds.insecure or None,
            token=creds.bearer(),
            scheme="Bearer" if creds.bearer() else None,
            certificate_path=creds.cert_file,
            private_key_path=creds.key_file,
        )

    # Indexes (what the reconciler's snapshot reads), then triggers: any change
    # wakes the one reconciler. kopf passes every index to every handler by id.
    for w in WATCHED:
        _index(w, registry)

    async def wake(**kwargs: Any) -> None:
        if not reconciler.sources:
            for w in WATCHED:
                reconciler.sources[w.name] = _reader(kwargs[w.index_id])
            reconciler.synced.set()
        reconciler.trigger()

    for w in WATCHED:
        kopf.on.event(w.group, w.version, w.plural, labels=w.labels, registry=registry,
                      id=f"wake-{w.plural}")(wake)

    return registry
