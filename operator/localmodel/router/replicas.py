"""What the router knows of each replica now: its slots and queue (the
gateway's /slots on its main port), its speed (/speed on its admin port),
and the requests this router has in flight there.

`ReplicaWatch.poll` reads every replica of the table once, at most
`POLL_CONCURRENCY` at a time, each read bounded in time (`READ_TIMEOUT_S`)
and size (speed_answer.READ_MAX_BYTES; a longer answer, or one announcing a
longer length, is a bad one, never parsed cut short), a redirect never
followed (the router's pods are admitted by every model's NetworkPolicy: a
replica must not point its reads elsewhere), as the operator reads /speed
(controller/speed.py). The server runs it every `--poll-interval` seconds. A
replica that answers badly or not at all is counted
(localmodel_router_replica_reads_total{namespace,pod,what,result}) and its
state goes unknown, which keeps its sessions home; its old state is not
trusted. Everything here is keyed by the replica's identity (`Replica.id`:
namespace/pod), so what one replica answers sets only its own state, and
`owning` is asked only about the replicas of the session's own model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import aiohttp

from localmodel.gateway_contract import SLOTS_PATH, SPEED_PATH
from localmodel.gateway_contract.speed_answer import READ_MAX_BYTES
from localmodel.metrics import Counter
from localmodel.router.answers import BadDocument, Slots, Speed, slots_from, speed_from
from localmodel.router.decide import ReplicaState, wait_seconds
from localmodel.router.table import Replica, RouteTable

READ_TIMEOUT_S = 2.0
POLL_CONCURRENCY = 16


@dataclass
class Known:
    """Keeps what a replica's /slots and /speed last said."""

    slots: Slots | None = None
    speed: Speed | None = None


class ReplicaWatch:
    """Keeps what each replica last said and its requests in flight, and decides its state (its
    wait)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.known: dict[str, Known] = {}
        self.in_flight: dict[str, int] = {}
        self.reads = Counter("localmodel_router_replica_reads_total",
                             "reads of the replicas' /slots and /speed, by result",
                             ("namespace", "pod", "what", "result"))
        self._clock = clock

    def state(self, rid: str) -> ReplicaState:
        known = self.known.get(rid)
        mine = self.in_flight.get(rid, 0)
        if known is None or known.slots is None:
            return ReplicaState(wait_s=None, prefill_tps=None)
        speed = known.speed or Speed(None, None)
        occupied = max(known.slots.occupied, mine)
        return ReplicaState(wait_s=wait_seconds(known.slots.total, occupied, speed.mean_request_s),
                            prefill_tps=speed.prefill_tps)

    def owning(self, ids: Iterable[str], key: str) -> list[str]:
        """Those of the replicas `ids` (the session's own model's) whose last
        /slots listed `key` among the sessions routers sent them as owner
        (gateway/owned.py); no other replica's list is read."""
        out = []
        for rid in ids:
            known = self.known.get(rid)
            if known is not None and known.slots is not None and key in known.slots.owned:
                out.append(rid)
        return out

    @contextlib.contextmanager
    def sending(self, rid: str) -> Iterator[None]:
        """Count one request in flight to the replica `rid` (its `Replica.id`)
        while the block runs."""
        self.in_flight[rid] = self.in_flight.get(rid, 0) + 1
        try:
            yield
        finally:
            self.in_flight[rid] -= 1
            if not self.in_flight[rid]:
                del self.in_flight[rid]

    async def poll(self, session: aiohttp.ClientSession, table: RouteTable,
                   mark: Callable[[str, str], dict[str, str]] | None = None) -> None:
        """Read every replica once; `mark(namespace, pod)`: the headers of a
        /slots read (the router's signed mark, gateway_contract/marks.py)."""
        replicas = {r.id: r for route in table for r in route.replicas}
        for gone in set(self.known) - set(replicas):
            del self.known[gone]
        gate = asyncio.Semaphore(POLL_CONCURRENCY)

        async def one(replica: Replica) -> None:
            async with gate:
                headers = {} if mark is None else mark(replica.namespace, replica.name)
                await self._read(session, replica, headers)

        await asyncio.gather(*(one(r) for r in replicas.values()))

    async def _read(self, session: aiohttp.ClientSession, replica: Replica,
                    headers: dict[str, str]) -> None:
        known = self.known.setdefault(replica.id, Known())
        who = (replica.namespace, replica.name)
        raw = await self._get(session, replica.url + SLOTS_PATH, who, "slots", headers)
        try:
            known.slots = None if raw is None else slots_from(raw)
        except BadDocument:
            known.slots = None
            self.reads.inc(1, (*who, "slots", "bad"))
        else:
            if raw is not None:
                self.reads.inc(1, (*who, "slots", "ok"))
        if replica.admin_url is None:
            return
        raw = await self._get(session, replica.admin_url + SPEED_PATH, who, "speed")
        try:
            known.speed = None if raw is None else speed_from(raw, self._clock())
        except BadDocument:
            known.speed = None
            self.reads.inc(1, (*who, "speed", "bad"))
        else:
            if raw is not None:
                self.reads.inc(1, (*who, "speed", "ok"))

    async def _get(self, session: aiohttp.ClientSession, url: str, who: tuple[str, str],
                   what: str, headers: dict[str, str] | None = None) -> bytes | None:
        """The answer's bytes, at most READ_MAX_BYTES + 1 (decode refuses more); None
        when there is no 200 answer in time."""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S), \
                    session.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 200:
                    self.reads.inc(1, (*who, what, f"status_{resp.status // 100}xx"))
                    return None
                if resp.content_length is not None and resp.content_length > READ_MAX_BYTES:
                    self.reads.inc(1, (*who, what, "bad"))
                    return None
                raw = bytearray()
                while len(raw) <= READ_MAX_BYTES:
                    chunk = await resp.content.read(READ_MAX_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
                return bytes(raw)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            self.reads.inc(1, (*who, what, "unreachable"))
            return None
