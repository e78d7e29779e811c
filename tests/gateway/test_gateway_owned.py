"""The sessions a gateway was told it owns (gateway/owned.py): which header
values count, the order /slots lists them in, the bound and the idle expiry;
and the router tells only the owner, never passing a caller's claim on."""

from __future__ import annotations

import pytest

from localmodel.gateway.owned import OwnedSessions
from localmodel.gateway_contract.headers import OWNED_SESSION_HEADER, ROUTE_HEADER, owned_key
from localmodel.router.proxy import pass_headers
from tests.harness.clock import Clock

pytestmark = pytest.mark.unit

A, B, C = ("h:" + c * 24 for c in "abc")


@pytest.mark.parametrize(("value", "want"), [
    (A, A),
    ("f:0123456789abcdef01234567", "f:0123456789abcdef01234567"),
    (None, None),
    ("", None),
    ("h:" + "a" * 23, None),
    ("h:" + "a" * 25, None),
    ("H:" + "a" * 24, None),
    ("h:" + "A" * 24, None),
    ("x:" + "a" * 24, None),
    (A + "\n", None),
    (" " + A, None),
    ("my-session", None),  # a caller's own session name is not a key
    ("h:" + "a" * 10_000, None),
])
def test_only_a_session_key_counts(value: str | None, want: str | None) -> None:
    assert owned_key(value) == want


def test_listed_most_recent_first_each_once() -> None:
    owned = OwnedSessions(clock=Clock(100.0))
    for key in (A, B, A, C, None):
        owned.touch(key)
    assert owned.listed() == [C, A, B]
    assert owned.listed(most=2) == [C, A]
    assert len(owned) == 3


def test_bounded_least_recent_forgotten_first() -> None:
    owned = OwnedSessions(limit=2, clock=Clock(100.0))
    for key in (A, B, C):
        owned.touch(key)
    assert owned.listed() == [C, B]


def test_an_idle_session_is_forgotten() -> None:
    clock = Clock(100.0)
    owned = OwnedSessions(idle_s=60.0, clock=clock)
    owned.touch(A)
    clock.now += 30
    owned.touch(B)
    clock.now += 31  # A idle 61 s, B 31 s
    assert owned.listed() == [B]
    assert len(owned) == 1
    clock.now += 30
    assert owned.listed() == []


@pytest.mark.parametrize(("header", "value"), [
    (OWNED_SESSION_HEADER, A),
    (ROUTE_HEADER, "spilled; owner_wait_s=9.000; reread_s=0.100; wait_s=0.000"),
])
def test_the_router_says_its_own_and_drops_a_callers_claim(header: str, value: str) -> None:
    """A caller's X-LocalModel-Owned-Session or X-LocalModel-Route (any case)
    never reaches a replica through the router: only the router's own."""
    for name in (header, header.lower(), header.upper()):
        caller = {name: "forged", "X-LocalModel-Session": "s-1", "Content-Type": "application/json"}
        without = pass_headers(caller)
        assert not any(k.lower() == header.lower() for k in without)
        assert without["X-LocalModel-Session"] == "s-1"
        told = pass_headers(caller, {header: value})
        assert [v for k, v in told.items() if k.lower() == header.lower()] == [value]
