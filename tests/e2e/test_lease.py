"""The leader Lease against a real control plane while the operator's event loop
is held, as a long pass holds it (seconds of CPU at a thousand models).

The operator runs in this process (`controller.main.operate`: the whole of
`localmodel run`, kopf's watches, the reconciler, the Lease's thread, the
endpoints) on an event loop of its own thread, so that the test can hold that
loop exactly as a pass does: a callback on it that computes in pure Python for
several lease durations and never awaits. Nothing of the operator is replaced.
The API server, the second replica (a `localmodel run` process) and the
intruder that takes the Lease (the admin's PUT) are real.

- Held for three lease durations, with a second replica ready to take over the
  moment the Lease expires: the Lease's renewTime keeps advancing within the
  renewal deadline, its holder and transitions never change, no lease is
  counted lost, the standby never leads.
- Held while the Lease is taken from it for real: it stops leading (counted,
  `reason="taken"`), writes nothing at all afterwards (the audit log), not even
  for a model created meanwhile, and reconciles that model once the Lease is
  free again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localmodel.controller.config import parse_config
from localmodel.controller.main import operate
from localmodel.kube import credentials
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.chart import NAMESPACE
from tests.harness.cluster import OPERATOR
from tests.harness.fixtures import operator_cluster, operator_running, tools_or_fail
from tests.harness.kubeapi import KubeApi
from tests.harness.processes import free_ports, wait_until

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "operator-nodes.yaml"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/localmodel-operator"
LEASE_SECONDS = 6.0  # renewed every 1.5 s; the holder stops writing 4 s after its last renewal
RENEW_DEADLINE = LEASE_SECONDS * 2 / 3
HOLD_SECONDS = 3 * LEASE_SECONDS
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
QWEN = MakeLocalModel("m").spec(model="qwen3:0.6b", cpu=2, context=4096,
                                storage={"retain": False, "size": "5Gi"})


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    with operator_cluster(tools_or_fail(), FIXTURE, audit=True) as c:
        yield c


def _hold(seconds: float, held: list[float]) -> None:
    """What a long pass does to the loop: pure-Python work, no await."""
    began = time.monotonic()
    total = 0
    while time.monotonic() - began < seconds:
        total += sum(i * i for i in range(2000))
    held.append(time.monotonic() - began)


@dataclass
class InProcessOperator:
    """`operate()` on an event loop of its own thread, in this process."""

    cluster: TestCluster
    identity: str
    health_port: int = 0
    metrics_port: int = 0
    loop: asyncio.AbstractEventLoop | None = None
    stop: asyncio.Event | None = None
    code: list[int] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.health_port, self.metrics_port = free_ports(2)
        config = parse_config([
            "--kubeconfig", str(self.cluster.kubeconfig(OPERATOR)),
            "--identity", self.identity,
            "--leader-namespace", NAMESPACE,
            "--lease-seconds", str(LEASE_SECONDS),
            "--health-listen", f"127.0.0.1:{self.health_port}",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--operator-image", "ghcr.io/localmodel/localmodel-operator:e2e",
        ], {})
        creds = credentials(config.kubeconfig)
        started = threading.Event()

        async def main() -> None:
            self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
            started.set()
            self.code.append(await operate(config, creds, stop=self.stop))

        self.thread = threading.Thread(target=asyncio.run, args=(main(),),
                                       name=f"operator-{self.identity}", daemon=True)
        self.thread.start()
        assert started.wait(30), "the operator's loop did not start"
        wait_until(f"{self.identity} ready", lambda: self._get(self.health_port, "/readyz")[0]
                   == 200, timeout=120, alive=self._alive)

    def _alive(self) -> None:
        assert self.thread is not None and self.thread.is_alive(), f"exited: {self.code}"

    def _get(self, port: int, path: str, timeout: float = 2) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                        timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except OSError:
            return 0, ""

    def answers(self) -> bool:
        """Whether its loop serves a request within a second (not while held)."""
        return self._get(self.health_port, "/healthz", timeout=1)[0] == 200

    def metrics(self) -> str:
        return self._get(self.metrics_port, "/metrics", timeout=10)[1]

    def hold(self, seconds: float) -> list[float]:
        """Hold its loop for `seconds`, from now (returns at once; the list gets
        how long the hold lasted when it ends)."""
        assert self.loop is not None
        held: list[float] = []
        self.loop.call_soon_threadsafe(_hold, seconds, held)
        return held

    def close(self) -> None:
        if self.loop is not None and self.stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop.set)
        if self.thread is not None:
            self.thread.join(60)
            if self.thread.is_alive():
                frames = sys._current_frames()
                stacks = "\n".join(f"--- {t.name}:\n" + "".join(traceback.format_stack(
                    frames[t.ident])) for t in threading.enumerate() if t.ident in frames)
                raise AssertionError(f"the in-process operator did not stop:\n{stacks}")


@pytest.fixture
def inproc(cluster: TestCluster) -> Iterator[InProcessOperator]:
    op = InProcessOperator(cluster, identity=f"inproc-{secrets.token_hex(2)}")
    op.start()
    try:
        yield op
    finally:
        op.close()


@dataclass
class LeaseSampler:
    """Reads the Lease every `every` seconds on a thread: (monotonic, spec)."""

    cluster: TestCluster
    every: float = 0.2
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> LeaseSampler:
        api = self.cluster.api()

        def run() -> None:
            while not self._stop.is_set():
                status, body = api.request("GET", LEASE, timeout=5)
                if status == 200:
                    self.samples.append((time.monotonic(), body["spec"]))
                self._stop.wait(self.every)

        self._thread = threading.Thread(target=run, name="lease-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


def leads(metrics: str) -> bool:
    return "localmodel_operator_leader 1" in metrics.splitlines()


def put(api: KubeApi, path: str, body: dict[str, Any]) -> None:
    status, answer = api.request("PUT", path, body)
    assert status == 200, (status, answer)


def lease_spec(cluster: TestCluster) -> dict[str, Any]:
    spec: dict[str, Any] = cluster.api().get(LEASE)["spec"]
    return spec


def test_a_held_event_loop_delays_no_renewal_and_hands_over_nothing(
    cluster: TestCluster, inproc: InProcessOperator
) -> None:
    wait_until("the in-process operator to hold the Lease",
               lambda: lease_spec(cluster).get("holderIdentity") == inproc.identity, timeout=60)
    with operator_running(cluster, "standby",
                          extra_args=("--lease-seconds", str(LEASE_SECONDS))) as standby:
        before = lease_spec(cluster)
        with LeaseSampler(cluster) as sampler:
            time.sleep(2 * LEASE_SECONDS)  # the standby watches the Lease renewed
            held = inproc.hold(HOLD_SECONDS)
            time.sleep(1)
            answered_while_held = inproc.answers()
            wait_until("the hold to end", lambda: bool(held), timeout=HOLD_SECONDS * 10)
            time.sleep(2 * LEASE_SECONDS)
        after_metrics = inproc.metrics()
        standby_metrics = standby.metrics()
    holders = {spec.get("holderIdentity") for _, spec in sampler.samples}
    transitions = {spec.get("leaseTransitions") for _, spec in sampler.samples}
    renewals = sorted({_stamp(spec["renewTime"]) for _, spec in sampler.samples})
    gaps = [b - a for a, b in itertools.pairwise(renewals)]
    print(f"\nloop held {held[0]:.1f} s; {len(renewals)} renewals seen over "
          f"{renewals[-1] - renewals[0]:.1f} s, the longest gap {max(gaps):.2f} s "
          f"(renewal deadline {RENEW_DEADLINE:.1f} s, lease {LEASE_SECONDS:.0f} s)")
    assert held[0] >= HOLD_SECONDS
    assert not answered_while_held, "the hold did not hold the operator's loop"
    assert holders == {inproc.identity}, holders
    assert transitions == {before.get("leaseTransitions")}, transitions
    # On time: every renewal within the deadline after the one before, held or not.
    assert max(gaps) < RENEW_DEADLINE, gaps
    assert len(renewals) >= (2 * LEASE_SECONDS + HOLD_SECONDS) / RENEW_DEADLINE
    assert leads(after_metrics), after_metrics
    assert metric(after_metrics, "localmodel_operator_leases_lost_total") == 0
    assert not leads(standby_metrics)


def test_the_lease_taken_while_the_loop_is_held_stops_every_write(
    cluster: TestCluster, inproc: InProcessOperator
) -> None:
    api = cluster.api()
    wait_until("the in-process operator to hold the Lease",
               lambda: lease_spec(cluster).get("holderIdentity") == inproc.identity, timeout=60)
    ns = f"lm-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        held = inproc.hold(HOLD_SECONDS)
        time.sleep(1)
        lease = api.get(LEASE)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"] |= {"holderIdentity": "intruder", "leaseDurationSeconds": 3600,
                          "acquireTime": now, "renewTime": now,
                          "leaseTransitions": int(lease["spec"].get("leaseTransitions", 0)) + 1}
        put(api, LEASE, lease)
        taken = len(cluster.audit_events())
        api.create(f"/apis/localmodel.dev/v1alpha1/namespaces/{ns}/localmodels",
                   QWEN.named("late", ns).manifest())
        wait_until("the hold to end", lambda: bool(held), timeout=HOLD_SECONDS * 10)
        time.sleep(3 * LEASE_SECONDS)  # its Lease rounds, kopf's events, any pass
        metrics = inproc.metrics()
        writes = [e for e in cluster.audit_events()[taken:] if e["verb"] in WRITE_VERBS]
        print(f"\nloop held {held[0]:.1f} s; after the Lease was taken: {len(writes)} writes")
        assert writes == [], [(e["verb"], e["objectRef"]) for e in writes[:10]]
        assert not leads(metrics)
        assert metric(metrics, 'localmodel_operator_leases_lost_total{reason="taken"}') == 1
        assert api.get(f"/api/v1/namespaces/{ns}/pods")["items"] == []
        # The Lease free again: it takes it and reconciles what it missed.
        lease = api.get(LEASE)
        lease["spec"] |= {"holderIdentity": "", "leaseDurationSeconds": 1}
        put(api, LEASE, lease)
        wait_until("the operator to lead again", lambda: leads(inproc.metrics()), timeout=60)
        wait_until("the late model's pod", lambda: bool(
            api.get(f"/api/v1/namespaces/{ns}/pods")["items"]), timeout=120)
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{ns}")
