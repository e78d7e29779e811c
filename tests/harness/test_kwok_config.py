"""kwok's configuration: its own defaults, and one lease renewer per fake node."""

from __future__ import annotations

import pytest

from tests.harness.cluster import KWOK_DEFAULT_OPTIONS, kwok_configuration


@pytest.mark.parametrize(("nodes", "renewers"), [(1, 4), (4, 4), (6, 6), (300, 300),
                                                 (1000, 1000)])
def test_every_fake_node_gets_a_lease_renewer_of_its_own(nodes: int, renewers: int) -> None:
    config = kwok_configuration(nodes)
    assert (config["apiVersion"], config["kind"]) == (
        "config.kwok.x-k8s.io/v1alpha1", "KwokConfiguration")
    assert config["options"]["nodeLeaseParallelism"] == renewers


def test_the_file_states_every_default_kwok_would_otherwise_apply() -> None:
    """kwok applies no defaults to a KwokConfiguration it reads from a file: an
    option left out is zero (kwok refuses to start with a lease parallelism of 0)."""
    options = kwok_configuration(1000)["options"]
    assert set(options) == set(KWOK_DEFAULT_OPTIONS)
    assert {k: v for k, v in options.items() if k != "nodeLeaseParallelism"} == {
        k: v for k, v in KWOK_DEFAULT_OPTIONS.items() if k != "nodeLeaseParallelism"}
    assert all(options[k] > 0 for k in options if k.endswith("Parallelism"))
