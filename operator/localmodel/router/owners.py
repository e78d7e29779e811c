"""Which replica owns each live session: rendezvous hashing with bounded
loads, the owner remembered while the session lives. Pure.

Plain rendezvous hashing (router/session.py) balances sessions only on
average: with 4 sessions on 2 replicas it puts 3 on one replica about half
the time, and on one-slot CPU replicas the third waits or re-reads its history
elsewhere. Consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018,
https://arxiv.org/abs/1608.01350) caps every replica: a new session goes to
the first replica in its rendezvous ranking that is under its cap.

The cap, with m live sessions of the model (the new one counted) over n
Ready replicas: the largest whole number of sessions within `factor` times
the even share, floor(factor * m / n), but never below the even share
rounded up, ceil(m / n), so every session has a place. The paper rounds
c * m / n up; rounding down keeps a replica within factor times its share
even at the small counts a CPU model runs (4 sessions on 2 replicas: 2 each,
where rounding up would allow 3).

The owner is remembered per session (`Owners`, at most `MAX_SESSIONS`,
forgotten after `SESSION_IDLE_S` without a turn), so a session keeps it while it
lives, whatever the other sessions do. Only a change of the replicas moves a
session, and only the ones it must: a session whose owner left is placed
again; a replica that joined takes the sessions that rank it above their
owner while it is under its cap; nothing else moves. A replica may be over
its cap after sessions elsewhere end (nothing moves for that); a new session
never lands on a replica at its cap.

Two routers agree without talking to each other. Each counts the sessions
it has seen itself, so on their own they would agree only on sessions placed
at the first replica of their ranking; a session one router placed further
down (its first choice at the cap) could be placed differently by the other,
and its turns would then alternate between two replicas, each re-reading
what the other added. So a router tells the owner, on every turn it sends
there, that it owns the session (`X-LocalModel-Owned-Session`, with a mark
signed for that replica: gateway_contract/marks.py); the gateway lists the
sessions it was told so in /slots, to the routers only (gateway/owned.py); and a router
meeting a session it has no owner for takes, before placing it, the replica
that lists it (the first in the session's ranking, should two). Only a turn
arriving at the second router before the first's turn was answered and its
/slots read (one poll interval) is placed on its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from localmodel.gateway_contract.headers import SESSION_IDLE_S
from localmodel.router.session import ranking

BALANCE_FACTOR = 1.25  # the paper's c: a replica takes at most 1.25x its even share
MAX_SESSIONS = 10_000  # owners remembered; the least recently used is forgotten first


def cap(sessions: int, replicas: int, factor: float = BALANCE_FACTOR) -> int:
    """The most sessions one of `replicas` replicas takes of `sessions` live ones."""
    if replicas < 1 or sessions < 1:
        return 0
    even = -(-sessions // replicas)
    return min(sessions, max(even, math.floor(factor * sessions / replicas + 1e-9)))


def place(order: Sequence[str], loads: Mapping[str, int], limit: int,
          allowed: Iterable[str] | None = None) -> str | None:
    """The first replica of `order` (and of `allowed`, when given) under `limit`."""
    allow = None if allowed is None else set(allowed)
    for name in order:
        if (allow is None or name in allow) and loads.get(name, 0) < limit:
            return name
    return None


@dataclass
class _Entry:
    """Keeps one session's owner: the model, the replica, its peers when confirmed and when."""

    model: str
    replica: str
    members: frozenset[str]  # the model's replicas when the owner was last confirmed
    seen: float


class Owners:
    """Each live session's owner, per model."""

    def __init__(self, factor: float = BALANCE_FACTOR, idle_s: float = SESSION_IDLE_S,
                 limit: int = MAX_SESSIONS) -> None:
        self.factor = factor
        self.idle_s = idle_s
        self.limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently seen first
        self._loads: dict[str, dict[str, int]] = {}  # model -> replica -> sessions owned
        self._members: dict[str, frozenset[str]] = {}  # one shared set per model

    def owner(self, model: str, session: str, replicas: Sequence[str], now: float,
              listed: Collection[str] = ()) -> str:
        """The session's owner among `replicas` (non-empty), placing it if it
        has none there yet; `now` is a monotonic clock's seconds; `listed`:
        the replicas whose /slots list the session as owned (another router
        placed it there)."""
        return self.order(model, session, replicas, now, listed)[0]

    def order(self, model: str, session: str, replicas: Sequence[str],
              now: float, listed: Collection[str] = ()) -> list[str]:
        """The session's owner (as `owner`), then the other replicas in its
        rendezvous ranking: where a spill looks, best first. Remembered at
        once; the router itself uses `choose`, then `keep` once the replica
        accepted the turn."""
        order = self.choose(model, session, replicas, now, listed)
        self.keep(model, session, order[0], replicas, now)
        return order

    def choose(self, model: str, session: str, replicas: Sequence[str],
               now: float, listed: Collection[str] = ()) -> list[str]:
        """As `order`, remembering nothing: a turn the replica refuses (401,
        413, ...) must not hold a place in the table."""
        self._expire(now)
        members = self._shared(model, replicas)
        key = f"{model}\0{session}"
        order = ranking(key, members)
        entry = self._entries.get(key)
        loads = dict(self._loads.get(model, {}))
        if entry is not None:  # the session's own place is not a load against it
            loads[entry.replica] = loads.get(entry.replica, 0) - 1
        limit = cap(sum(loads.get(n, 0) for n in members) + 1, len(members), self.factor)
        chosen: str | None
        if entry is not None and entry.replica in members:
            joined = members - entry.members
            ahead = order[: order.index(entry.replica)]
            chosen = place(ahead, loads, limit, joined) or entry.replica
        else:
            held = [n for n in order if n in listed]
            chosen = held[0] if held else place(order, loads, limit) or order[0]
        return [chosen, *(n for n in order if n != chosen)]

    def keep(self, model: str, session: str, replica: str, replicas: Sequence[str],
             now: float) -> None:
        """Remember `replica` (of `replicas`) as the session's owner from `now`."""
        members = self._shared(model, replicas)
        key = f"{model}\0{session}"
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._count(entry, -1)
            members = self._shared(model, replicas)  # _count may have dropped the set
        entry = _Entry(model, replica, members, now)
        self._entries[key] = entry
        self._count(entry, +1)
        while len(self._entries) > self.limit:
            self._count(self._entries.popitem(last=False)[1], -1)

    def loads(self, model: str) -> dict[str, int]:
        """Sessions owned per replica of `model` (replicas with none left out)."""
        return {n: c for n, c in self._loads.get(model, {}).items() if c}

    def __len__(self) -> int:
        return len(self._entries)

    def _shared(self, model: str, replicas: Sequence[str]) -> frozenset[str]:
        members = frozenset(replicas)
        if not members:
            raise ValueError("a session's owner needs at least one replica")
        known = self._members.get(model)
        if known == members:
            return known
        self._members[model] = members
        return members

    def _expire(self, now: float) -> None:
        while self._entries:
            entry = next(iter(self._entries.values()))
            if now - entry.seen <= self.idle_s:
                return
            self._count(self._entries.popitem(last=False)[1], -1)

    def _count(self, entry: _Entry, by: int) -> None:
        loads = self._loads.setdefault(entry.model, {})
        loads[entry.replica] = loads.get(entry.replica, 0) + by
        if not loads[entry.replica]:
            del loads[entry.replica]
            if not loads:
                del self._loads[entry.model]
                self._members.pop(entry.model, None)
