"""Probe labels are valid Kubernetes labels and read back through from_node unchanged."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.facts import FactSource, NodeFacts
from localmodel.facts.flags import PROBE_CPU_FLAGS
from localmodel.facts.machine import from_this_machine
from localmodel.facts.node import from_node, is_label_value
from localmodel.probe import probe_labels
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

# Kubernetes label syntax: optional DNS-subdomain prefix, name <= 63 chars.
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def assert_valid_label(key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    assert DNS_SUBDOMAIN.fullmatch(prefix) and len(prefix) <= 253, key
    assert LABEL_NAME.fullmatch(name), key
    assert len(value) <= 63 and is_label_value(value), value


def facts(**fields: object) -> NodeFacts:
    return NodeFacts(name="n", allocatable_cpu_milli=4000, allocatable_memory_bytes=2**34,
                     **fields)  # type: ignore[arg-type]  # fmt: skip


PROBED = MakeNode("n").cpus(4).memory_gib(16)  # what the probe labelled


def test_amx_node_labels() -> None:
    f = facts(
        cpu_flags=frozenset({"AVX2", "AVX512F", "AMXTILE", "AMXINT8", "SHA"}),
        cpu_vendor="Intel",
        cpu_family="6",
        cpu_model_id="143",
        hyperthreading=True,
    )
    assert probe_labels(f) == {
        "localmodel.dev/cpu-flags-known": "true",
        "localmodel.dev/cpu.AVX2": "true",
        "localmodel.dev/cpu.AVX512F": "true",
        "localmodel.dev/cpu.AMXTILE": "true",
        "localmodel.dev/cpu.AMXINT8": "true",
        # SHA is not in PROBE_CPU_FLAGS: not labelled, to keep nodes small
        "localmodel.dev/cpu-vendor": "Intel",
        "localmodel.dev/cpu-family": "6",
        "localmodel.dev/cpu-model-id": "143",
        "localmodel.dev/cpu-hyperthreading": "true",
    }


def test_unknown_facts_produce_no_labels() -> None:
    assert probe_labels(facts()) == {}
    back = from_node(PROBED.labels(probe_labels(facts())).manifest())
    assert back.cpu_flags is None and back.source is FactSource.NONE


def test_known_but_empty_flags_still_say_known() -> None:
    labels = probe_labels(facts(cpu_flags=frozenset()))
    assert labels == {"localmodel.dev/cpu-flags-known": "true"}
    back = from_node(PROBED.labels(labels).manifest())
    assert back.cpu_flags == frozenset()
    assert back.has("AMXTILE") is False


@pytest.mark.parametrize("vendor", ["Centaur Hauls", "x" * 64, "-Intel", "Intel!"])
def test_vendor_that_is_not_a_label_value_is_left_out(vendor: str) -> None:
    labels = probe_labels(facts(cpu_vendor=vendor))
    assert "localmodel.dev/cpu-vendor" not in labels
    assert from_node(PROBED.labels(labels).manifest()).cpu_vendor is None


def test_probe_flag_list_has_unique_label_safe_names() -> None:
    assert len(set(PROBE_CPU_FLAGS)) == len(PROBE_CPU_FLAGS)
    for flag in PROBE_CPU_FLAGS:
        assert flag == flag.upper()
        assert_valid_label("localmodel.dev/cpu." + flag, "true")
    for needed in ["AVX2", "AVX512F", "AVX512VNNI", "AMXTILE", "AMXINT8", "AMXBF16"]:
        assert needed in PROBE_CPU_FLAGS


def test_this_machine_round_trips_through_its_probe_labels() -> None:
    mine = from_this_machine(Path("/"))
    labels = probe_labels(mine)
    for key, value in labels.items():
        assert_valid_label(key, value)
    back = from_node(PROBED.labels(labels).manifest())
    for flag in PROBE_CPU_FLAGS:
        assert back.has(flag) == mine.has(flag), flag
    assert back.cpu_vendor == mine.cpu_vendor
    assert back.hyperthreading == mine.hyperthreading


label_value_text = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True)
flag_sets = st.frozensets(
    st.one_of(st.sampled_from(PROBE_CPU_FLAGS), st.sampled_from(["SHA", "ADX", "AVX10", "VAES"]))
)


@settings(max_examples=150, deadline=None)
@given(
    flags=st.one_of(st.none(), flag_sets),
    vendor=st.one_of(st.none(), st.sampled_from(["Intel", "AMD", "Hygon"]), label_value_text),
    family=st.one_of(st.none(), st.integers(0, 300).map(str)),
    model_id=st.one_of(st.none(), st.integers(0, 300).map(str)),
    hyperthreading=st.one_of(st.none(), st.booleans()),
    other=st.dictionaries(st.sampled_from(["kubernetes.io/hostname", "zone", "pool"]),
                          label_value_text, max_size=3),
)  # fmt: skip
def test_from_node_recovers_what_probe_labels_encode(
    flags: frozenset[str] | None,
    vendor: str | None,
    family: str | None,
    model_id: str | None,
    hyperthreading: bool | None,
    other: dict[str, str],
) -> None:
    original = facts(
        cpu_flags=flags,
        source=FactSource.MACHINE if flags is not None else FactSource.NONE,
        cpu_vendor=vendor,
        cpu_family=family,
        cpu_model_id=model_id,
        hyperthreading=hyperthreading,
    )
    labels = probe_labels(original)
    for key, value in labels.items():
        assert_valid_label(key, value)
    back = from_node(PROBED.labels({**other, **labels}).manifest())

    if flags is None:
        assert back.cpu_flags is None
        assert back.source is FactSource.NONE
    else:
        assert back.source is FactSource.PROBE
        assert back.cpu_flags == flags & frozenset(PROBE_CPU_FLAGS)
        for flag in PROBE_CPU_FLAGS:
            assert back.has(flag) is original.has(flag)
        for flag in flags - frozenset(PROBE_CPU_FLAGS):
            assert back.has(flag) is None  # never probed: unknown, not absent
    assert back.cpu_vendor == vendor
    assert back.cpu_family == family
    assert back.cpu_model_id == model_id
    assert back.hyperthreading is hyperthreading
    assert back.labels == {**other, **labels}
