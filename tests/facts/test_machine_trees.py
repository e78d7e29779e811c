"""Machine facts over recorded and kernel-format /proc, /sys and cgroup trees
(tests/fixtures/machines/README.md says which is which)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localmodel.facts.cpu import AmxKernel
from localmodel.facts.machine import read_machine
from localmodel.facts.topology import format_cpu_list, parse_cpu_list, read_topology
from localmodel.probe.labels import probe_labels

pytestmark = pytest.mark.unit

TREES = Path(__file__).resolve().parents[1] / "fixtures" / "machines"


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        (
            "recorded-2cpu-v1",
            {"host_cpus": 2, "cpu_budget": 2.0, "cpuset_cpus": 2, "cgroup_cpu_quota": None,
             "physical_cores": 2, "threads_per_core": 1, "sockets": 1, "smt_active": False,
             "numa_nodes": {"0": "0-1"}, "cpu_vendor": "Intel", "cpu_model_id": "207"},
        ),
        (
            "recorded-2cpu-v1-quota1",
            {"host_cpus": 2, "cpu_budget": 1.0, "cgroup_cpu_quota": 1.0, "physical_cores": 2},
        ),
        (
            "smt-2numa-v2-quota",
            {"host_cpus": 16, "cpu_budget": 4.5, "cpuset_cpus": 8, "cgroup_cpu_quota": 4.5,
             "physical_cores": 8, "threads_per_core": 2, "sockets": 2, "smt_active": True,
             "numa_nodes": {"0": "0-3,8-11", "1": "4-7,12-15"},
             "memory_bytes": 16 * 2**30, "host_memory_bytes": 131072000 * 1024},
        ),
        (
            "nosmt-v2-max",
            {"host_cpus": 8, "cpu_budget": 8.0, "cgroup_cpu_quota": None, "physical_cores": 8,
             "threads_per_core": 1, "smt_active": False, "cgroup_memory_bytes": None},
        ),
        (
            "smt-v1-quota-no-sysfs",
            {"host_cpus": 4, "cpu_budget": 2.0, "cgroup_cpu_quota": 2.0, "physical_cores": 2,
             "threads_per_core": 2, "sockets": 1, "smt_active": None, "numa_nodes": {},
             "cpu_vendor": "AMD", "memory_bytes": 4 * 2**30},
        ),
    ],
)
def test_facts_of_each_tree(tree: str, expected: dict[str, object]) -> None:
    facts = read_machine(TREES / tree).as_json()
    assert {key: facts[key] for key in expected} == expected


def test_smt_siblings_form_the_cores() -> None:
    topo = read_topology(TREES / "smt-2numa-v2-quota")
    assert topo.cores[:2] == (frozenset({0, 8}), frozenset({1, 9}))
    assert len(topo.cores) == 8
    assert topo.numa_nodes[1] == parse_cpu_list("4-7,12-15")


def test_smt_shows_in_the_node_facts_and_labels() -> None:
    node = read_machine(TREES / "smt-2numa-v2-quota").node
    assert node.hyperthreading is True
    labels = probe_labels(node)
    assert labels["localmodel.dev/cpu-physical-cores"] == "8"
    assert labels["localmodel.dev/cpu-threads-per-core"] == "2"
    assert labels["localmodel.dev/numa-nodes"] == "2"
    assert labels["localmodel.dev/cpu.AMXTILE"] == "true"


def test_cpuinfo_stands_in_for_missing_sysfs() -> None:
    topo = read_topology(TREES / "smt-v1-quota-no-sysfs")
    assert topo.cores == (frozenset({0, 2}), frozenset({1, 3}))


def test_amx_kernel_is_unknown_for_a_recorded_tree_unless_given() -> None:
    assert read_machine(TREES / "smt-2numa-v2-quota").amx_kernel is None
    given = read_machine(TREES / "smt-2numa-v2-quota", amx=lambda: AmxKernel.OFFERED)
    assert given.as_json()["amx_kernel"] == "offered"


def test_a_broken_sibling_list_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/cpu/cpu0/topology").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0\n")
    (tmp_path / "sys/devices/system/cpu/cpu0/topology/thread_siblings_list").write_text("zero\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1024 kB\n")
    with pytest.raises(ValueError, match="thread_siblings_list"):
        read_machine(tmp_path)


def test_cgroup_v1_unlimited_memory_is_no_limit(tmp_path: Path) -> None:
    # cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (as recorded on the VM).
    (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1048576 kB\n")
    facts = read_machine(tmp_path)
    assert facts.cgroup.memory_bytes is None
    assert facts.node.allocatable_memory_bytes == 2**30


@pytest.mark.parametrize("cpus", [{0}, {0, 1, 2, 3, 8}, {1, 3, 5}, {0, 1, 4, 5, 6, 100}])
def test_cpu_list_spelling_round_trips(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus
    assert format_cpu_list({0, 1, 2, 3, 8}) == "0-3,8"


def test_the_daemonsets_four_mounts_are_all_the_probe_needs(tmp_path: Path) -> None:
    """The chart mounts only these host paths under /host (tests/chart checks the list)."""
    import shutil

    source = TREES / "smt-2numa-v2-quota"
    for path in ("proc/cpuinfo", "proc/meminfo", "sys/devices/system/cpu",
                 "sys/devices/system/node"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if (source / path).is_dir():
            shutil.copytree(source / path, tmp_path / path)
        else:
            shutil.copy(source / path, tmp_path / path)
    full, mounted = read_machine(source), read_machine(tmp_path)
    assert probe_labels(mounted.node) == probe_labels(full.node)
    node_keys = ("host_cpus", "host_memory_bytes", "physical_cores", "threads_per_core",
                 "sockets", "smt_active", "numa_nodes", "cpu_flags", "cpu_model_name")
    assert {k: mounted.as_json()[k] for k in node_keys} == {k: full.as_json()[k]
                                                              for k in node_keys}
