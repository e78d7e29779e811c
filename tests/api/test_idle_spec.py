"""spec.idle: its defaults, nothing written for a model without it, Go durations
read as the API server's CEL reads them, and the time zone check only the
operator can make. (Each bad input's refusal, offline and by the API server:
tests/corpus.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.api import IdleSpec, parse_local_model
from localmodel.api.checks import go_duration_ns
from localmodel.crd import build_crd
from localmodel.desired import desired_state
from localmodel.status import status_body
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

MODEL = MakeLocalModel("qwen3").cpu(2)

# What Go 1.26's time.ParseDuration returns for each (nanoseconds; None: an
# error), read from Go itself: CEL's duration() is that parse.
GO_PARSE_DURATION: dict[str, int | None] = {
    "30m": 1800000000000,
    "1h30m": 5400000000000,
    "1.5h": 5400000000000,
    "59.9999999999s": 59999999999,
    "60.0000000001s": 60000000000,
    "59.9999999999999999999s": 60000000000,  # the fraction's float rounds up
    "604800.000000001s": 604800000000001,
    "0.1ns": 0,
    "1.9ns": 1,
    "0.3333333333333333333h": 1200000000000,
    "2562047h47m16.854775807s": 9223372036854775807,
    "2562047h47m16.854775808s": None,
    "9223372036854775807ns": 9223372036854775807,
    "9223372036854775808ns": None,
    "1h1m1s1ms1us1ns": 3661001001001,
    "00001.000010000m": 60000600000,
    "999999999999h": None,
}


@pytest.mark.parametrize(("text", "ns"), GO_PARSE_DURATION.items())
def test_a_duration_reads_as_go_reads_it(text: str, ns: int | None) -> None:
    assert go_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "5", "-5m", "+5m", "5d", "1µs", ".5h", "5m ", "1" * 33])
def test_what_the_pattern_refuses_is_no_duration(text: str) -> None:
    assert go_duration_ns(text) is None


def test_the_defaults_and_the_python_names() -> None:
    idle = IdleSpec.model_validate({"after": "30m", "awake": [
        {"from": "22:00", "to": "06:00"},
        {"days": ["Sat"], "from": "10:00", "to": "12:00", "timeZone": "Europe/Berlin"}]})
    assert (idle.priority, idle.release, idle.hold_seconds) == (0, "OnDemand", 120)
    assert idle.after_seconds == 1800
    night, saturday = idle.awake
    assert saturday.days == ["Sat"]
    assert (night.days, night.from_, night.to, night.time_zone) == (
        None, "22:00", "06:00", "UTC")
    assert idle.model_dump(by_alias=True, exclude_none=True)["awake"] == [
        {"from": "22:00", "to": "06:00", "timeZone": "UTC"},
        {"days": ["Sat"], "from": "10:00", "to": "12:00", "timeZone": "Europe/Berlin"}]


def test_a_model_without_idle_gets_no_idle_field_and_no_idle_status() -> None:
    lm = MODEL.obj()
    assert lm.spec.idle is None
    assert "idle" not in lm.spec.model_dump(by_alias=True, exclude_none=True)
    [r] = desired_state([lm], [MakeNode("n0").facts()], now="2026-12-01T00:00:00Z",
                        ready={lm.key: {0: True}}).models
    assert "idle" not in status_body(r.status)
    assert not any(c.type == "Awake" for c in r.status.conditions)


def test_the_crd_gives_idle_no_default_and_shows_its_state_in_the_wide_view() -> None:
    version: dict[str, Any] = build_crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    idle = schema["properties"]["spec"]["properties"]["idle"]
    assert "default" not in idle
    assert idle["required"] == ["after"]
    window = idle["properties"]["awake"]["items"]
    assert window["properties"]["days"]["x-kubernetes-list-type"] == "set"
    assert window["x-kubernetes-validations"][0]["rule"] == "self.from != self.to"
    # `kubectl get lm -o wide` shows the state; the default view is unchanged.
    assert version["additionalPrinterColumns"][-1] == {
        "name": "Idle", "type": "string", "jsonPath": ".status.idle.state", "priority": 1}


def test_a_known_time_zone_is_valid_and_an_unknown_one_is_invalid_spec() -> None:
    def valid(zone: str) -> tuple[str, str]:
        lm = parse_local_model(MODEL.spec(idle={"after": "30m", "awake": [
            {"from": "08:00", "to": "18:00", "timeZone": zone}]}).manifest())
        [r] = desired_state([lm], [MakeNode("n0").facts()], now="2026-12-01T00:00:00Z",
                            ready={lm.key: {}}).models
        c = next(c for c in r.status.conditions if c.type == "Valid")
        return c.status.value, c.message

    assert valid("Europe/Berlin") == ("True", "spec accepted")
    assert valid("Etc/GMT+5") == ("True", "spec accepted")
    assert valid("Mars/Base") == (
        "False", "spec.idle.awake[0].timeZone: 'Mars/Base' is not a time zone this operator "
        "knows (an IANA name such as Europe/Berlin or UTC)")
    assert valid("America")[0] == "False"  # a directory of the database is no zone
