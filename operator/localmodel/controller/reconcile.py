"""The one reconciler: wait for a trigger, debounce, snapshot, plan, apply, report.

One task, because the planner is global (exclusive models claim whole nodes):
per-object handlers planning at once could put two models on one node. Every
watch event only records and triggers; a pass reads the whole in-memory
snapshot (`indexes`, kept by kopf from its watches: nothing here lists the
cluster), calls the pure core (`snapshot.observe`, then `plan.plan_pass`:
desired state and each model's changes and status; `stuck.avoid_stuck`: which
nodes a model avoids), then has `model_writes.ModelWriter` write what differs
and post the Events. A pass that fails part-way is harmless: the next one
starts again from what the watches show.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from localmodel.contract import OPERATOR
from localmodel.controller.clock import rfc3339
from localmodel.controller.closer import Closer
from localmodel.controller.config import OperatorConfig
from localmodel.controller.model_work import ModelWork, PassPlan
from localmodel.controller.model_writes import ModelWriter, PassResult
from localmodel.controller.observed import Observed, unschedulable
from localmodel.controller.operator_metrics import ConditionTally, OperatorMetrics
from localmodel.controller.parse_memo import Parsed
from localmodel.controller.plan import plan_pass
from localmodel.controller.reports import RETRY_SECONDS
from localmodel.controller.secrets import MAX_AGE_SECONDS as SECRET_MAX_AGE
from localmodel.controller.secrets import NamedSecrets, SecretLabels
from localmodel.controller.signing import RouterSigning
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.speed import SpeedBook
from localmodel.controller.stuck import avoid_stuck
from localmodel.controller.wake_watch import WakeWatch
from localmodel.controller.watched import WATCHED
from localmodel.controller.work_memo import KeptWork
from localmodel.controller.writer import Kube, NotLeading
from localmodel.events import EventSpec
from localmodel.idle.asks import IdleSignals
from localmodel.incremental import Desired
from localmodel.render import RenderOptions

log = logging.getLogger("localmodel.reconcile")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cycle collector off while a pass computes. A pass allocates
    container objects by the hundred thousand and keeps most of them, and the
    collector's repeated scans of everything alive cost more than the pass
    itself (measured: a cold pass at 4k nodes 3.7 s with it, 1.7 s paused,
    docs/benchmarks.md). Reference counting still frees what a pass drops at
    once; one collection of the young generations afterwards finds any cycles."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(1)


def render_options(config: OperatorConfig) -> RenderOptions:
    """What the operator's settings give every render."""
    return RenderOptions(
        operator_image=config.operator_image,
        allow_http_downloads=config.allow_http_downloads,
        network_policy=config.network_policy,
        image_registry=config.image_registry,
        image_pull_secrets=config.image_pull_secrets,
        # The operator's own namespace first: it reads the gateways' /speed.
        admin_namespaces=tuple(dict.fromkeys((config.leader_namespace,
                                              *config.admin_namespaces))),
        router_namespace=config.router_namespace,
        router_url=config.router_url,
    )


class Reconciler:
    """When a pass runs (triggers, debounce, retries, the Lease), and what a pass
    keeps for the next: the memo layers, the placements, the avoided nodes."""

    def __init__(
        self,
        config: OperatorConfig,
        kube: Kube,
        metrics: OperatorMetrics,
        *,
        identity: str = OPERATOR,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.kube = kube
        self.metrics = metrics
        self.identity = identity
        self.clock = clock
        self.sources: dict[str, Callable[[], Iterable[Mapping[str, Any]]]] = {}
        self._wake = asyncio.Event()
        self._first_trigger = 0.0
        self._retry: asyncio.TimerHandle | None = None
        self.synced = asyncio.Event()
        self.passes = 0
        self._current: asyncio.Task[PassResult] | None = None
        self._aborted = False
        # model -> node -> until when: nodes whose pods stayed Unschedulable
        self.avoid: dict[str, dict[str, float]] = {}
        self._reported_stuck: dict[str, str] = {}  # pod -> message already reported
        self._placed: dict[str, dict[int, str]] = {}  # the last pass's placements
        self._render_options = render_options(config)
        # Each Ready replica's speed, filled by controller.speed.SpeedReader.
        self.speed = SpeedBook(config.speed_policy)
        self.speed_wake: Callable[[], None] = lambda: None  # a replica to read appeared
        metrics.speed_ratios = self.speed.ratios
        self._parsed = Parsed()  # each stored version of a model or node parsed once
        self._desired = Desired()  # what passes worked out, reused while its inputs hold
        self._kept = KeptWork()  # each model's changes and status, the same way
        self._tally = ConditionTally()
        # The number of the last plan whose work was all gone through, and that
        # work's models that were not idle (`PassPlan.since`: the next plan's
        # other models have the same, idle work).
        self._serial: int | None = None
        self._busy: dict[str, ModelWork] = {}
        self._named = NamedSecrets()  # the Secrets models name, for the policy
        self.writer = ModelWriter(kube, metrics, identity, config.write_concurrency,
                                  self.trigger_later)  # each model's writes
        self._secrets = SecretLabels(kube)  # named Secrets' labels, for the policy
        self._signing = RouterSigning.of(kube, config, self.trigger_later)  # router's key
        # spec.idle's I/O: the routers' held requests (main.py sets the watch
        # when the router is on) and the closes a pass asks of the gateways.
        self.wake_watch: WakeWatch | None = None
        self.closer = Closer(self._signing.private_key if self._signing else lambda: None,
                             self.trigger, metrics.idle.yields)

    def idle_signals(self, now: float) -> IdleSignals:
        """What the shell knows for this pass's idle decisions: the held
        requests per model over every router, the latest answer per pod to a close."""
        waiting = self.wake_watch.waiting() if self.wake_watch is not None else {}
        return IdleSignals(now, MappingProxyType(dict(waiting)), self.closer.closes(),
                           MappingProxyType(self.speed.readings_by_model()),
                           self.config.idle_settings)

    def abort_pass(self) -> None:
        """Stop a pass under way (this replica lost the Lease: it must not write)."""
        if self._current is not None and not self._current.done():
            self._aborted = True
            self._current.cancel()

    # ---- triggers ---------------------------------------------------------

    def trigger(self) -> None:
        if not self._wake.is_set():
            self._first_trigger = time.monotonic()
        self._wake.set()

    def trigger_later(self, seconds: float) -> None:
        """Wake the reconciler in `seconds` (one timer: the earliest wins)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._retry is not None and self._retry.when() > now
        if pending and self._retry is not None and self._retry.when() <= now + seconds:
            return
        if self._retry is not None:
            self._retry.cancel()
        self._retry = loop.call_later(seconds, self.trigger)

    def snapshot(self) -> Snapshot:
        def take(name: str) -> list[Mapping[str, Any]]:
            source = self.sources.get(name)
            return list(source()) if source else []

        return Snapshot(**{w.name: take(w.name) for w in WATCHED})

    # ---- the loop ----------------------------------------------------------

    async def run(self, leading: asyncio.Event) -> None:
        await self.synced.wait()
        while True:
            await self._wake.wait()
            await leading.wait()
            await self._quiet()
            started = time.monotonic()
            self._current = asyncio.create_task(self.reconcile_once())
            try:
                result = await self._current
            except (asyncio.CancelledError, NotLeading) as exc:  # NotLeading: the fence's
                if isinstance(exc, asyncio.CancelledError) and not self._aborted:
                    raise
                self._aborted = False
                log.warning("reconcile pass aborted: leadership lost")
                self.metrics.passes.inc(labels=("aborted",))
                self.trigger_later(RETRY_SECONDS[0])  # it runs once the Lease is held
                continue
            except Exception:  # one bad pass must never stop the operator
                log.exception("reconcile pass failed; retrying")
                self.metrics.passes.inc(labels=("error",))
                self.trigger_later(RETRY_SECONDS[1])
                continue
            finally:
                self.metrics.pass_seconds.observe(time.monotonic() - started)
            self.passes += 1
            self.metrics.passes.inc(labels=("failed" if result.failures else "ok",))

    async def _quiet(self) -> None:
        """Coalesce a burst: wait until it is quiet, but not forever."""
        while True:
            self._wake.clear()
            waited = time.monotonic() - self._first_trigger
            quiet = min(self.config.debounce_seconds,
                        max(0.0, self.config.max_delay_seconds - waited))
            if quiet <= 0:
                break
            await asyncio.sleep(quiet)
            if not self._wake.is_set():
                break
        self._wake.clear()

    async def reconcile_once(self) -> PassResult:
        now = self.clock()
        now_s = rfc3339(now)
        with gc_paused():
            obs = observe(self.snapshot(), self.config.namespaces, self._parsed)
            self.writer.forget_gone(obs)
            for name, why in obs.bad_nodes.items():
                log.warning("node %s is left out of placement: %s", name, why)
            extra_events = self._avoid_stuck(obs, now)
            for key, told in self.closer.take_events().items():
                extra_events.setdefault(key, []).extend(told)
            secrets = await self._secret_labels(obs)
            if self._signing is not None:
                self._render_options = await self._signing.options(self._render_options)
            planned = self._plan(obs, now_s, secrets, self.idle_signals(now))
        result = PassResult(models=len(obs.models))
        since = planned.since
        new = ({} if planned.serial == self._serial else since[1]
               if since is not None and since[0] == self._serial else None)
        if new is not None and not extra_events:  # only `new` differs from the work gone through
            if not new and not self._busy:
                return result  # the very work gone through, all of which needed no write
            work = {**self._busy, **new}
            if new:
                self.metrics.models_by_condition = self._tally.recount(
                    {k: w.status for k, w in new.items()})
        else:
            work = {w.model.key: w for w in planned.work}
            self.metrics.models_by_condition = self._tally.count(
                {k: w.status for k, w in work.items()})
        idle = self.writer.idle
        await asyncio.gather(*(self.writer.model(w, now_s, result, obs, extra_events.get(k, []))
                               for k, w in work.items() if idle.get(k) is not w
                               or k in extra_events))
        self._busy = {k: w for k, w in work.items() if idle.get(k) is not w}
        self._serial = planned.serial
        return result

    async def _secret_labels(self, obs: Observed) -> dict[tuple[str, str], Mapping[str, str]]:
        """The labels of the Secrets models name that the admin's policy must see;
        while a model waits for one, the next pass re-reads it (secrets.py)."""
        if not (wanted := self._named.of(obs.models, self.config.tenants)):
            return {}
        found = await self._secrets.labels(wanted)
        rule = self.config.tenants.secret_label
        if any(k not in found or (rule and not rule.holds(found[k])) for k in wanted):
            self.trigger_later(SECRET_MAX_AGE)
        return found

    def _plan(self, obs: Observed, now: str,
              secrets: Mapping[tuple[str, str], Mapping[str, str]],
              idle: IdleSignals | None = None) -> PassPlan:
        planned = plan_pass(obs, now, self._render_options, idle=idle,
                            placed=self._placed, avoid=self.avoid,
                            speeds=self.speed.published_by_model(),
                            speed_policy=self.speed.policy, desired=self._desired,
                            tenants=self.config.tenants, secrets=secrets, kept=self._kept)
        self._placed = planned.placed
        if self.speed.retarget(planned.speed_targets):
            self.speed_wake()
        self._idle_io(planned)
        return planned

    def _idle_io(self, planned: PassPlan) -> None:
        """What the pass's idle decisions ask of the shell: the closes to send,
        the answers (and leases) to keep, and when to look again."""
        idle = planned.idle
        self.closer.retain(idle.retain)
        if idle.closes:
            self.closer.send(idle.closes)
        if idle.recheck_in is not None:
            self.trigger_later(idle.recheck_in)

    def _avoid_stuck(self, obs: Observed, now: float) -> dict[str, list[EventSpec]]:
        """Apply `stuck.avoid_stuck`: the nodes to avoid, the Events, a recheck."""
        verdict = avoid_stuck(unschedulable(obs), self.avoid, self._reported_stuck, now,
                              self.config.unschedulable_seconds)
        self.avoid, self._reported_stuck = verdict.avoid, verdict.reported
        if verdict.recheck_in is not None:
            self.trigger_later(verdict.recheck_in)
        for stuck, age in verdict.moved:
            log.warning("%s: pod %s Unschedulable on %s for %.0f s: avoiding that node",
                        stuck.model, stuck.pod, stuck.node, age)
        return verdict.events

