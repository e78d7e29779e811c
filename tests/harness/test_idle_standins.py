"""The stand-in gateway's clock (tests/harness/idle_standins.py): paced, it
runs `pace` times the host's, so a benchmark's model is quiet for `after` in
less wall time; moved on, it adds the seconds at once. Its door judges
quiet on that clock."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.harness import idle_standins
from tests.harness.idle_standins import Standin

pytestmark = pytest.mark.unit


class HostClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def standin(monkeypatch: pytest.MonkeyPatch, host: HostClock, pace: float) -> Standin:
    monkeypatch.setattr(idle_standins.time, "monotonic", host)
    return Standin("ns", "m0-0", "m0", Ed25519PrivateKey.generate().public_key(), pace=pace)


def test_a_paced_stand_in_is_quiet_pace_times_as_long_as_the_host_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = HostClock()
    s = standin(monkeypatch, host, pace=4.0)
    host.now += 15.0
    assert s.clock() == pytest.approx(1000.0 + 60.0)
    assert s.door.activity()["idle_seconds"] == pytest.approx(60.0)


def test_moving_a_stand_in_on_adds_to_its_paced_clock_and_a_request_ends_the_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = HostClock()
    s = standin(monkeypatch, host, pace=2.0)
    s.idle_for(100.0)
    host.now += 5.0
    assert s.door.activity()["idle_seconds"] == pytest.approx(110.0)
    assert s.door.arrive()
    assert s.door.activity()["idle_seconds"] == 0.0  # busy: not quiet at all
    s.door.end()
    host.now += 1.0
    assert s.door.activity()["idle_seconds"] == pytest.approx(2.0)


def test_an_unpaced_stand_in_keeps_the_hosts_time() -> None:
    s = Standin("ns", "m0-0", "m0", Ed25519PrivateKey.generate().public_key())
    assert s.pace == 1.0 and s.answer_s == 0.0 and s.held_ms == []
    assert abs(s.clock() - idle_standins.time.monotonic()) < 60.0
