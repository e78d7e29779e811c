"""The cluster source's glue: list, then watch, each resource in each namespace
the router serves, in a thread of its own, and keep what `router.cluster`
reads of each object. `ClusterSource.routes()` answers from memory.

Each follower lists (in pages), then watches from the list's resourceVersion
(with bookmarks, so a quiet watch resumes where it was); an expired
resourceVersion (410), a dropped connection or a refused request starts over
with a new list after a short, growing pause, which replaces what it kept. An
object the router cannot read is logged (once per object and version) and
left out; it never stops the watch. Bounds: a watch line (one object) of at
most MAX_LINE bytes, at most MAX_OBJECTS objects kept per follower, pages of
PAGE objects, a request that answers nothing for longer than its timeout is
dropped and started again.

Clients come from `localmodel.kube` (--kubeconfig, KUBECONFIG, else the pod's
service account), as for every command that talks to a cluster.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from localmodel import GROUP, PLURAL, VERSION
from localmodel.contract import OWNED_SELECTOR
from localmodel.router.cluster import (
    ModelEntry,
    SliceEntry,
    Unreadable,
    keep_model,
    keep_slice,
    object_key,
    route_table,
)
from localmodel.router.table import RouteTable, qualified_only_notes

log = logging.getLogger("localmodel.router.cluster")

T = TypeVar("T")
Raw = Mapping[str, Any]
ListCall = Callable[..., Any]  # a kubernetes client list_* function, bound to its scope

MAX_LINE = 3 * 1024 * 1024  # one watch event: an object is at most 1.5 MiB in etcd
MAX_OBJECTS = 10_000  # kept per follower
PAGE = 250
WATCH_SECONDS = 240  # the server ends each watch after this; the client waits a bit longer
CONNECT_SECONDS = 10.0
PAUSES = (0.5, 1.0, 2.0, 5.0, 10.0)  # between failed attempts, then the last one again
SELECTOR = ",".join(f"{k}={v}" for k, v in sorted(OWNED_SELECTOR.items()))


class WatchGone(Exception):
    """The watch's resourceVersion expired (410): list again."""


def lines(chunks: Iterator[bytes], limit: int = MAX_LINE) -> Iterator[bytes]:
    """The newline-separated lines of a stream, each at most `limit` bytes."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
        if len(buffer) > limit:
            raise ValueError(f"a watch event over {limit} bytes")
    if buffer.strip():
        yield buffer


@dataclass
class Kept(Generic[T]):
    """What one follower keeps: (namespace, name) -> entry, under the source's lock."""

    entries: dict[tuple[str, str], T]
    refused: set[tuple[str, str, str]]  # (namespace, name, resourceVersion) already logged


class Follower(threading.Thread, Generic[T]):
    """One resource in one scope, listed and watched for as long as the process runs."""

    def __init__(self, what: str, call: ListCall, keep: Callable[[Raw], T],
                 changed: Callable[[], None], lock: threading.Lock,
                 selector: str = "", watch_seconds: int = WATCH_SECONDS) -> None:
        super().__init__(name=f"router-watch {what}", daemon=True)
        self.watch_seconds = watch_seconds
        self.what, self.call, self.keep, self.selector = what, call, keep, selector
        self.changed, self.lock = changed, lock
        self.kept: Kept[T] = Kept({}, set())
        self.synced = threading.Event()  # listed at least once
        self.lists = self.watches = 0  # requests made (what a test or a log can read)
        self.stopping = threading.Event()

    def run(self) -> None:
        failures, version = 0, ""
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self.relist()
                    failures = 0
                # A watch the server ended resumes where it was (bookmarks keep
                # `version` current on a quiet watch); only a failure lists again.
                version = self.watch(version)
            except WatchGone:
                version = ""
                log.info("%s: the watch expired; listing again", self.what)
            except Exception as exc:  # any failure: list again after a pause
                version = ""
                pause = PAUSES[min(failures, len(PAUSES) - 1)]
                failures += 1
                log.warning("%s: %s: %s; again in %.1f s", self.what, type(exc).__name__,
                            str(exc)[:300], pause)
                self.stopping.wait(pause)

    def _selected(self) -> dict[str, Any]:
        return {"label_selector": self.selector} if self.selector else {}

    def relist(self) -> str:
        fresh: dict[tuple[str, str], T] = {}
        token, version = "", ""
        self.lists += 1
        while True:
            resp = self.call(**self._selected(), limit=PAGE, _continue=token or None,
                             _preload_content=False,
                             _request_timeout=(CONNECT_SECONDS, 60.0))
            body = json.loads(resp.data)
            for item in body.get("items") or []:
                self._read(item, fresh)
            meta = body.get("metadata") or {}
            version, token = str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")
            if not token:
                break
        with self.lock:
            self.kept.entries = fresh
        self.synced.set()
        self.changed()
        return version

    def watch(self, version: str) -> str:
        """Watch from `version` until the server ends the watch; the last version seen."""
        self.watches += 1
        resp = self.call(**self._selected(), watch=True, resource_version=version,
                         allow_watch_bookmarks=True, timeout_seconds=self.watch_seconds,
                         _preload_content=False,
                         _request_timeout=(CONNECT_SECONDS, self.watch_seconds + 30.0))
        try:
            for line in lines(resp.stream(64 * 1024, decode_content=True)):
                if self.stopping.is_set():
                    break
                version = self.event(json.loads(line)) or version
        finally:
            resp.release_conn()
        return version

    def event(self, event: Raw) -> str:
        """Apply one watch event; the resourceVersion it carries ("" if none)."""
        kind, obj = event.get("type"), event.get("object")
        obj = obj if isinstance(obj, Mapping) else {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchGone()
            raise RuntimeError(f"watch error {obj.get('code')}: {str(obj.get('message'))[:200]}")
        meta = obj.get("metadata")
        version = str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
        if kind == "BOOKMARK" or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return version
        with self.lock:
            if kind == "DELETED":
                try:
                    self.kept.entries.pop(object_key(obj), None)
                except Unreadable:
                    return version
            else:
                self._read(obj, self.kept.entries)
        self.changed()
        return version

    def _read(self, obj: Raw, into: dict[tuple[str, str], T]) -> None:
        """Keep what is read of `obj`; an unreadable one is dropped and logged once."""
        try:
            key = object_key(obj)
        except Unreadable as exc:
            log.warning("%s: an object left out: %s", self.what, exc)
            return
        try:
            entry = self.keep(obj)
        except Unreadable as exc:
            into.pop(key, None)
            version = str((obj.get("metadata") or {}).get("resourceVersion"))
            if (key[0], key[1], version) not in self.kept.refused:
                if len(self.kept.refused) >= MAX_OBJECTS:
                    self.kept.refused.clear()
                self.kept.refused.add((key[0], key[1], version))
                log.warning("%s: left out: %s", self.what, exc)
            return
        if key not in into and len(into) >= MAX_OBJECTS:
            log.warning("%s: %s/%s left out: already %d kept (the bound)",
                        self.what, key[0], key[1], MAX_OBJECTS)
            return
        into[key] = entry


class ClusterSource:
    """The router's ReplicaSource from the cluster: LocalModels and their
    Services' EndpointSlices in `namespaces` (empty: every namespace)."""

    def __init__(self, api_client: Any, namespaces: Sequence[str] = (),
                 watch_seconds: int = WATCH_SECONDS) -> None:
        from kubernetes import client

        custom, discovery = client.CustomObjectsApi(api_client), client.DiscoveryV1Api(api_client)
        self._lock = threading.Lock()
        self._dirty = True
        self._table: RouteTable = ()
        self._notes: frozenset[str] = frozenset()  # conflicts already logged
        self._listeners: list[Callable[[], None]] = []  # told of every change (any thread)
        self.models: list[Follower[ModelEntry]] = []
        self.slices: list[Follower[SliceEntry]] = []

        def scoped(call: ListCall, *args: Any) -> ListCall:
            return lambda **kw: call(*args, **kw)

        for ns in namespaces or ("",):
            where = f"in {ns}" if ns else "in every namespace"
            models = (scoped(custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL)
                      if ns else scoped(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL))
            slices = (scoped(discovery.list_namespaced_endpoint_slice, ns) if ns
                      else scoped(discovery.list_endpoint_slice_for_all_namespaces))
            self.models.append(Follower(f"LocalModels {where}", models, keep_model,
                                        self._changed, self._lock, "", watch_seconds))
            self.slices.append(Follower(f"EndpointSlices {where}", slices, keep_slice,
                                        self._changed, self._lock, SELECTOR, watch_seconds))

    @property
    def followers(self) -> list[Follower[Any]]:
        return [*self.models, *self.slices]

    def start(self) -> ClusterSource:
        for f in self.followers:
            f.start()
        return self

    def stop(self) -> None:
        for f in self.followers:
            f.stopping.set()

    def synced(self) -> bool:
        """Whether every watch has listed once (before that, routes() may miss models)."""
        return all(f.synced.is_set() for f in self.followers)

    def wait_synced(self, seconds: float) -> bool:
        """Wait up to `seconds` for every watch's first list; whether they all came."""
        deadline = time.monotonic() + seconds
        return all(f.synced.wait(max(0.0, deadline - time.monotonic())) for f in self.followers)

    def listen(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from a watch's thread) whenever what is kept changed:
        the router's held requests look again at once (router/holding.py)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        with self._lock:
            self._dirty = True
        for callback in list(self._listeners):
            callback()

    def routes(self) -> RouteTable:
        with self._lock:
            if self._dirty:
                self._dirty = False
                self._table = self._rebuild()
            return self._table

    def _rebuild(self) -> RouteTable:
        """The table from what is kept (under the lock); each new conflict logged once."""
        models = [e for f in self.models for e in f.kept.entries.values()]
        slices = [e for f in self.slices for e in f.kept.entries.values()]
        table, shadowed = route_table(models, slices)
        notes = {s.message for s in shadowed} | {
            f"LocalModel {m.namespace}/{m.name} runs without its gateway "
            "(spec.gateway.enabled: false): the router does not route to it"
            for m in models if not m.gateway} | set(qualified_only_notes(table))
        for note in sorted(notes - self._notes):
            log.warning("%s", note)
        self._notes = frozenset(notes)
        return table
