"""Which models a caller sees in the router's listings (docs/router.md,
Listings and keys).

A model that asks for no key is listed to everyone. A keyed model (its
LocalModel has `spec.gateway.auth`; static: `;keys` after its URLs) is listed
only to a caller whose key its gateway accepts. The router holds no keys and
reads no Secret: it asks one Ready replica's gateway (GET KEY_CHECK_PATH on the
inference port, no engine work) whether a key of its file gives a proof of the
caller's key for a fresh nonce (gateway_contract/keys.py, `key_proof`). The
key itself never leaves the router, so a gateway whose image a tenant chose
learns nothing it could call with.

Fail closed: a caller without a bearer key sees no keyed model (and nothing is
asked); a check that fails, times out, answers anything but 204 or 401, or is
past the bounds leaves the model out. Bounded: at most `MAX_CHECKS` checks per
listing, `CONCURRENCY` in flight for the whole router, `CHECK_SECONDS` each and
`LISTING_SECONDS` for a listing's checks together; answers (204 and 401 only)
are cached per (salted digest of the key, model) for `TTL_SECONDS`, at most
`MAX_CACHED` entries, the oldest dropped first. The raw key is never kept.

`Answers` (the cache) and `to_check` are pure; `KeyChecks` does the asking.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from localmodel.gateway_contract.keys import (
    KEY_CHECK_PATH,
    KEY_NONCE_HEADER,
    KEY_PROOF_HEADER,
    bearer,
    key_proof,
)
from localmodel.metrics import Counter
from localmodel.router.metrics import PREFIX
from localmodel.router.table import ModelRoute, RouteTable, open_models

TTL_SECONDS = 10.0  # how long a gateway's answer about a key stands
MAX_CACHED = 4096  # (key, model) answers kept
MAX_CHECKS = 32  # checks one listing may start; past them, models are left out
CONCURRENCY = 8  # checks in flight for the whole router
CHECK_SECONDS = 2.0  # one check, connection included
LISTING_SECONDS = 3.0  # a listing's checks together
REPLICAS_ASKED = 2  # per model and check: the next one is asked only if one fails


@dataclass
class Answers:
    """Gateways' answers about keys, per (salted key digest, model): bounded, expiring."""

    clock: Callable[[], float] = time.monotonic
    ttl: float = TTL_SECONDS
    limit: int = MAX_CACHED
    _kept: OrderedDict[tuple[bytes, str], tuple[float, bool]] = field(
        default_factory=OrderedDict)

    def get(self, who: bytes, model: str) -> bool | None:
        """True accepted, False refused, None unknown (never asked, or expired)."""
        kept = self._kept.get((who, model))
        if kept is None:
            return None
        if kept[0] <= self.clock():
            del self._kept[(who, model)]
            return None
        return kept[1]

    def put(self, who: bytes, model: str, accepted: bool) -> None:
        self._kept.pop((who, model), None)
        self._kept[(who, model)] = (self.clock() + self.ttl, accepted)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


def to_check(table: RouteTable, known: Callable[[str], bool | None],
             limit: int = MAX_CHECKS) -> tuple[tuple[str, ...], tuple[ModelRoute, ...]]:
    """The keyed models already known to accept the key (qualified names), and
    those still to ask (with a Ready replica, at most `limit`). `known` says
    True, False, or None: not known (a model that did not answer lately is
    known as False for everyone: see `Answers`, NO_ANSWER)."""
    accepted: list[str] = []
    ask: list[ModelRoute] = []
    for route in table:
        if not route.keyed:
            continue
        answer = known(route.qualified)
        if answer is True:
            accepted.append(route.qualified)
        elif answer is None and route.replicas and len(ask) < limit:
            ask.append(route)
    return tuple(accepted), tuple(ask)


# The cache's "who" for a model whose replicas gave no answer: it is not asked
# again, for any caller, for TTL_SECONDS (a hanging gateway costs the router's
# checks once per TTL, not once per listing).
NO_ANSWER = b""


class KeyChecks:
    """Asks keyed models' gateways about a caller's key; see the module's text."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.answers = Answers(clock)
        self._salt = secrets.token_bytes(32)  # the cache's keys say nothing outside this process
        self._gate = asyncio.Semaphore(CONCURRENCY)
        self.checking = 0  # checks in flight now
        self.answered = Counter(PREFIX + "key_checks_total",
                                "keyed models' gateways asked about a caller's key, by answer: "
                                "accepted, refused, none (no answer: left out)", ("answer",))

    async def visible(self, http: aiohttp.ClientSession, table: RouteTable,
                      authorization: str | None) -> frozenset[str]:
        """The qualified names of the models this caller may see listed."""
        shown = open_models(table)  # listed to every caller
        token = bearer(authorization)
        if token is None or len(shown) == len(table):
            return shown
        who = hmac.new(self._salt, token.encode("utf-8", "replace"), hashlib.sha256).digest()
        accepted, ask = to_check(table, lambda model: False if self.answers.get(
            NO_ANSWER, model) is not None else self.answers.get(who, model))
        if ask:
            digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
            tasks = [asyncio.create_task(self._check(http, route, who, digest)) for route in ask]
            try:
                done, _ = await asyncio.wait(tasks, timeout=LISTING_SECONDS)
            finally:  # past the time, or the caller left: no check outlives its listing
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            accepted += tuple(r.qualified for r, t in zip(ask, tasks, strict=True)
                              if t in done and not t.cancelled() and t.exception() is None
                              and t.result())
        return shown | frozenset(accepted)

    async def _check(self, http: aiohttp.ClientSession, route: ModelRoute, who: bytes,
                     digest: bytes) -> bool:
        """Ask up to REPLICAS_ASKED of the model's replicas; True only on a 204."""
        async with self._gate:
            self.checking += 1
            try:
                for replica in route.replicas[:REPLICAS_ASKED]:
                    answer = await self._ask(http, replica.url, digest)
                    if answer is not None:
                        self.answers.put(who, route.qualified, answer)
                        return answer
            finally:
                self.checking -= 1
        self.answers.put(NO_ANSWER, route.qualified, False)
        return False

    async def _ask(self, http: aiohttp.ClientSession, url: str, digest: bytes) -> bool | None:
        nonce = secrets.token_hex(16)
        headers = {KEY_NONCE_HEADER: nonce, KEY_PROOF_HEADER: key_proof(digest, nonce)}
        try:
            async with http.get(url + KEY_CHECK_PATH, headers=headers, allow_redirects=False,
                                timeout=aiohttp.ClientTimeout(total=CHECK_SECONDS)) as resp:
                status = resp.status  # the body is never read
        except (aiohttp.ClientError, TimeoutError, ValueError):
            status = 0
        answer = {204: True, 401: False}.get(status)
        self.answered.inc(1, ({True: "accepted", False: "refused", None: "none"}[answer],))
        return answer

