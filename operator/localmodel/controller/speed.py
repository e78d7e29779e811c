"""Reading each replica's speed from its gateway, and keeping the book of it.

The operator reads a Ready replica's gateway directly at its pod IP
(`GET http://<podIP>:8090/speed`, the gateway's admin port, about 500 bytes), not through the API
server's pod proxy: a proxied read costs the API server a request and a
connection to the kubelet per replica, and would need `pods/proxy`, which
lets its holder reach any port of any pod. The gateway gets no Kubernetes
permission at all. What is read when is `localmodel.speed.next_read`: one
read when a pod becomes Ready (its calibration), then at most one per
`--speed-interval` while it has traffic, thinning out to one per 10 minutes
for a replica without traffic. Reads are counted in
`localmodel_operator_gateway_reads_total{result}` (`RESULTS`).

A replica whose gateway does not answer (a dead node, a NetworkPolicy that
drops the operator's packets) costs a bounded wait and nothing else: at most
`READ_CONCURRENCY` reads are under way at once, and each read's
`READ_TIMEOUT_SECONDS` starts only when it gets its slot, so a round of
unanswered reads never fails the healthy replicas queued behind them. A
round of N reads takes at most ceil(N / READ_CONCURRENCY) x the timeout; it
runs in its own task, beside the reconcile passes, and a failed read is
counted, retried `--speed-idle-interval` later and changes no status.

The passes compute on the same event loop, and at 10k nodes a pass holds it
for seconds: a read whose answer arrived meanwhile must not be called a
timeout. A read's deadline is therefore pushed on by every stall of the loop
while it is under way (`_watch_stalls`): it times out only after about
`READ_TIMEOUT_SECONDS` of time in which it could have run.

Every answer is the tenant's (the gateway's image is theirs): a redirect is not
followed, a body is read whole up to READ_MAX_BYTES and refused past it, and
`speed_answer` turns the bytes into a bounded `Reading` or refuses them. Any
failure of one read is one of RESULTS for that replica, never the reader's end
(tests/gateway/test_speed_answers.py, tests/controller/test_speed_reader_hostile.py).

Peers a tenant cannot fake: a replica's calibration sets another replica's
expected speed only when its gateway runs the operator's own image (the image
the operator renders by default, `--operator-image`): that code measures the
engine, and the tenant cannot change what it reports. A replica whose gateway
is the tenant's own (`spec.gateway.image`) is still read and judged against
the vouched peers or its own calibration, but its numbers reach no other
model. Why the image and not the namespace or an admin's list: the image is
what decides whether the numbers are measured or made up, it holds across
namespaces (one team's replicas are good peers of another's), and it needs no
setting; outliers among vouched peers (a replica calibrated under a burst) are
dropped by `speed.inliers`.

`SpeedBook` is the state the reads build (deterministic: values in, values
out, table-tested in tests/controller/test_speed_book.py); `SpeedReader` is the thin
I/O loop around it; `speed_targets` says which replicas a pass has it read
(Ready, planned where they run, each with its peer key: `cpu_model`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

import aiohttp

from localmodel.catalog import lookup
from localmodel.ceiling import replica_ceiling
from localmodel.controller.observed import Observed
from localmodel.desired import ModelResult
from localmodel.facts import NodeFacts
from localmodel.gateway_contract import ADMIN_PORT, SPEED_PATH
from localmodel.gateway_contract.speed_answer import (
    READ_MAX_BYTES,
    BadDocument,
    reading_from_answer,
)
from localmodel.metrics import Counter
from localmodel.render.names import pod_name
from localmodel.speed import (
    Ceiling,
    Expected,
    PeerKey,
    Published,
    Rates,
    Reading,
    ReadLog,
    SlowState,
    SpeedPolicy,
    after_read,
    expected_speed,
    idle_read_every,
    next_read,
    publish,
    ratio_of,
    step,
    traffic,
)

log = logging.getLogger("localmodel.speed")

READ_TIMEOUT_SECONDS = 2.0  # one read: connect, request and answer
READ_CONCURRENCY = 16
STALL_TICK_SECONDS = 0.1  # how often a round of reads looks for a held-up event loop

# The `result` label of localmodel_operator_gateway_reads_total.
READ_OK = "ok"
READ_TIMEOUT = "timeout"  # no answer within READ_TIMEOUT_SECONDS
READ_UNREACHABLE = "unreachable"  # the connection failed (refused, reset, no route)
# An answer that is not a /speed document: a status other than 200 (a redirect
# included: it is not followed), a body longer than READ_MAX_BYTES, a malformed
# HTTP answer, or anything `speed_answer` refuses.
READ_BAD_ANSWER = "bad_answer"
RESULTS = (READ_OK, READ_TIMEOUT, READ_UNREACHABLE, READ_BAD_ANSWER)


@dataclass(frozen=True)
class SpeedTarget:
    """A Ready replica whose gateway can be read."""

    model: str  # "namespace/name"
    replica: int
    node: str
    pod: str
    uid: str
    ip: str
    peer: PeerKey
    # Whether its numbers may set other replicas' expectations: its gateway runs
    # the operator's own image (policy.speed_targets). A tenant chooses
    # `spec.gateway.image`, and a gateway of their own can say anything.
    vouched: bool = False
    # spec.idle: read at least this often whatever the traffic (speed.idle_read_every).
    read_every: float | None = None
    # Its node's decode ceiling (localmodel.ceiling), when the node's bandwidth is known.
    ceiling: Ceiling | None = None


@dataclass
class ReplicaBook:
    """Keeps one replica's speed: its target, read log, last reading, slow state, last rates with
    traffic and what was published."""

    target: SpeedTarget
    log: ReadLog | None = None
    reading: Reading | None = None
    state: SlowState = field(default_factory=SlowState)
    recent: Rates = field(default_factory=Rates)  # the last interval that had traffic
    published: Published | None = None


@dataclass
class SpeedBook:
    """Every Ready replica's reads, state and published numbers, by pod uid."""

    policy: SpeedPolicy = field(default_factory=SpeedPolicy)
    by_uid: dict[str, ReplicaBook] = field(default_factory=dict)

    def retarget(self, targets: Iterable[SpeedTarget]) -> bool:
        """The replicas to read now (from a pass); pods gone or not Ready are
        forgotten. True when a replica was added (read it at once)."""
        fresh = {t.uid: t for t in targets}
        added = bool(fresh.keys() - self.by_uid.keys())
        kept = {uid: b for uid, b in self.by_uid.items() if uid in fresh}
        for uid, target in fresh.items():
            if uid in kept:
                kept[uid].target = target
            else:
                kept[uid] = ReplicaBook(target)
        self.by_uid = kept
        return added

    def due(self, now: float) -> list[SpeedTarget]:
        return [b.target for b in self.by_uid.values()
                if next_read(b.log, self.policy, b.target.read_every) <= now]

    def next_due(self) -> float | None:
        times = [next_read(b.log, self.policy, b.target.read_every) for b in self.by_uid.values()]
        return min(times) if times else None

    def expected(self, uid: str) -> Expected:
        """What replica `uid` is expected to do: its peers are vouched replicas
        only (a tenant's own gateway image sets no other replica's expectation;
        its own calibration still sets its own)."""
        b = self.by_uid[uid]
        calibrations = {u: (o.target.peer, o.reading.calibration)
                        for u, o in self.by_uid.items()
                        if o.reading is not None and (o.target.vouched or u == uid)}
        return expected_speed(uid, b.target.peer, calibrations, b.target.ceiling)

    def record(self, uid: str, reading: Reading | None, now: float) -> bool:
        """One read of `uid` at `now` (None: it failed). True when the numbers to
        publish changed (the model's status should be written)."""
        b = self.by_uid.get(uid)
        if b is None:
            return False
        if reading is None:
            b.log = after_read(b.log, now, busy=False)
            return False
        between = traffic(b.reading, reading)
        busy = between is not None and between.requests > 0
        b.log = after_read(b.log, now, busy=busy)
        b.reading = reading
        expected = self.expected(uid)
        if busy and between is not None:
            b.recent = between.rates
            ratio = ratio_of(between.rates.decode, expected.decode)
            b.state = step(b.state, ratio, between.seconds, self.policy)
        new = Published(reading.calibration, b.recent, expected, b.state.slow, now)
        old = b.published
        b.published = publish(old, new, self.policy)
        return b.published is not old

    def published_by_model(self) -> dict[str, dict[int, Published]]:
        out: dict[str, dict[int, Published]] = {}
        for b in self.by_uid.values():
            if b.published is not None:
                out.setdefault(b.target.model, {})[b.target.replica] = b.published
        return out

    def readings_by_model(self) -> dict[str, dict[int, Reading]]:
        """Each replica's last reading by model and replica (its `activity`
        is the idle signal; its `at` how old it is): `IdleSignals.readings`."""
        out: dict[str, dict[int, Reading]] = {}
        for b in self.by_uid.values():
            if b.reading is not None:
                out.setdefault(b.target.model, {})[b.target.replica] = b.reading
        return out

    def ratios(self) -> dict[tuple[str, ...], float]:
        """The last decode ratio of each replica read with traffic (the metric)."""
        out: dict[tuple[str, ...], float] = {}
        for b in self.by_uid.values():
            if b.state.ratio is not None:
                namespace, name = b.target.model.split("/", 1)
                out[(namespace, name, str(b.target.replica), b.target.node)] = round(
                    b.state.ratio, 4)
        return out


@dataclass
class ReadCounters:
    """Keeps the counters of the operator's reads of the gateways' /speed."""

    reads: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_gateway_reads_total",
        "Reads of a replica's gateway speed (GET /speed at the pod IP) by result.",
        ("result",)))
    read_bytes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_gateway_read_bytes_total",
        "Bytes of the gateways' /speed answers the operator read."))


class SpeedReader:
    """Reads what the book says is due, records it, and asks for a pass when
    the published numbers changed. Only the leader reads."""

    def __init__(self, book: SpeedBook, counters: ReadCounters, on_change: Callable[[], None],
                 clock: Callable[[], float] = time.time, port: int = ADMIN_PORT) -> None:
        self.book = book
        self.port = port
        self.counters = counters
        self.on_change = on_change
        self.clock = clock
        self.wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        # The reads' own bound, taken before a read starts its clock: aiohttp's
        # timeout also runs while a request waits for a connection of its pool,
        # so with only the pool's limit, the reads queued behind unanswered ones
        # timed out without being tried.
        self._slots = asyncio.Semaphore(READ_CONCURRENCY)
        self._deadlines: set[asyncio.Timeout] = set()  # of the reads under way
        self._last_tick = 0.0
        self._tick: asyncio.TimerHandle | None = None

    async def run(self, leading: asyncio.Event) -> None:
        async with self.session():
            while True:
                await leading.wait()
                await self.read_due()
                await self._sleep()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        # No timeout of aiohttp's own: a read's deadline is its `asyncio.timeout`,
        # which `_watch_stalls` moves on while the loop is held up.
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None,
                                        sock_read=None)
        connector = aiohttp.TCPConnector(limit=READ_CONCURRENCY, force_close=True)
        # The bytes counted against READ_MAX_BYTES are the bytes sent (no inflating
        # a compressed answer), and no replica's cookie is ever sent to another.
        async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                         auto_decompress=False,
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:
            self._session = session
            try:
                yield
            finally:
                self._session = None

    async def _sleep(self) -> None:
        due = self.book.next_due()
        wait = self.book.policy.interval if due is None else max(0.5, due - self.clock())
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=min(wait, self.book.policy.interval))

    async def read_due(self) -> None:
        due = self.book.due(self.clock())
        if not due:
            return
        loop = asyncio.get_running_loop()
        self._last_tick = loop.time()
        self._tick = loop.call_later(STALL_TICK_SECONDS, self._watch_stalls)
        try:
            results = await asyncio.gather(*(self._read(t) for t in due))
        finally:
            if self._tick is not None:
                self._tick.cancel()
                self._tick = None
        changed = False
        now = self.clock()
        for target, reading in zip(due, results, strict=True):
            changed = self.book.record(target.uid, reading, now) or changed
        if changed:
            self.on_change()

    def _watch_stalls(self) -> None:
        """A timer callback every STALL_TICK_SECONDS while reads are under way:
        when it runs late, the loop was held up (a pass computing) for that long,
        and every read's deadline moves on by as much. It runs before a deadline
        that fell due in the same stall (timers run in the order they are due),
        so a read gets at least READ_TIMEOUT_SECONDS - STALL_TICK_SECONDS of
        time in which it could run."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        stall = now - self._last_tick - STALL_TICK_SECONDS
        if stall > 0:
            for deadline in self._deadlines:
                when = deadline.when()
                # One that fell due before this callback ran is ending its read.
                if when is not None and not deadline.expired():
                    deadline.reschedule(when + stall)
        self._last_tick = now
        self._tick = loop.call_later(STALL_TICK_SECONDS, self._watch_stalls)

    async def _read(self, target: SpeedTarget) -> Reading | None:
        async with self._slots:
            result, reading = await self._read_one(target)
        self.counters.reads.inc(labels=(result,))
        return reading

    async def _read_one(self, target: SpeedTarget) -> tuple[str, Reading | None]:
        """One read of one replica, as (result, reading): whatever the replica
        does is one of RESULTS, never an exception out of here (a cancellation
        aside)."""
        url = f"http://{target.ip}:{self.port}{SPEED_PATH}"
        why: Exception
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS) as deadline:
                self._deadlines.add(deadline)
                try:
                    raw = await self._answer(url)
                finally:
                    self._deadlines.discard(deadline)
            self.counters.read_bytes.inc(len(raw))
            return READ_OK, reading_from_answer(raw, self.clock(), target.uid)
        except TimeoutError as exc:
            result, why = READ_TIMEOUT, exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            result, why = READ_UNREACHABLE, exc
        except Exception as exc:  # BadDocument, a malformed answer, anything it set off
            result, why = READ_BAD_ANSWER, exc
        log.debug("speed of %s replica %d (%s): %s %s: %.200s", target.model, target.replica,
                  url, result, type(why).__name__, why)
        return result, None

    async def _answer(self, url: str) -> bytes:
        """The whole body of a 200 answer, at most READ_MAX_BYTES; BadDocument for
        any other status (redirects are not followed: the tenant's gateway could
        name any address) and for a longer body (never parsed cut short)."""
        assert self._session is not None
        async with self._session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise BadDocument(f"answered {resp.status}")
            if resp.content_length is not None and resp.content_length > READ_MAX_BYTES:
                raise BadDocument(f"announced {resp.content_length} bytes, more than "
                                  f"{READ_MAX_BYTES}")
            body = bytearray()
            while chunk := await resp.content.read(READ_MAX_BYTES + 1 - len(body)):
                body += chunk
                if len(body) > READ_MAX_BYTES:
                    raise BadDocument(f"longer than {READ_MAX_BYTES} bytes")
            return bytes(body)


def cpu_model(node: NodeFacts | None) -> tuple[str, str, str] | None:
    """The node's CPU model (vendor, family, model id), None unless all are known."""
    if node is None or not (node.cpu_vendor and node.cpu_family and node.cpu_model_id):
        return None
    return (node.cpu_vendor, node.cpu_family, node.cpu_model_id)


def speed_targets(result: ModelResult, obs: Observed, own_image: str) -> list[SpeedTarget]:
    """The model's replicas whose gateway the operator can read: Ready pods of
    this model with a pod IP, on the node they are planned on, with their peer
    key and their node's decode ceiling at their threads, the decided KV cache and
    a slot's full context; vouched for when the pod's gateway runs `own_image`
    (the operator's)."""
    lm = result.model
    mo = obs.models.get(lm.key)
    if mo is None or not lm.spec.gateway.enabled:
        return []
    pods = {p.replica: p for p in obs.pods_of(lm.key)
            if p.owner_uid == mo.uid and p.ready and p.ip and not p.terminating}
    out = []
    shape = lookup(lm.spec.model, lm.spec.model_info)
    for r in result.replicas:
        pod = pods.get(r.replica)
        if pod is None or pod.ip is None or pod.node != r.node or pod.name != pod_name(
                lm, r.replica):
            continue
        peer = PeerKey(lm.spec.model, lm.spec.engine.resolved_image(), r.tuning.threads,
                       cpu_model(obs.nodes.get(r.node)))
        idle = lm.spec.idle
        ceiling = replica_ceiling(shape, obs.nodes.get(r.node), r.tuning.threads,
                                  lm.spec.context, r.tuning.kv_cache)
        out.append(SpeedTarget(lm.key, r.replica, r.node, pod.name, pod.uid, pod.ip, peer,
                               vouched=pod.gateway_image == own_image,
                               read_every=idle_read_every(idle.after_seconds) if idle else None,
                               ceiling=ceiling.ceiling if ceiling is not None else None))
    return out
