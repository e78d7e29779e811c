"""NodeFacts for this machine, from fake /proc + /sys trees and from the real machine."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.facts import FactSource
from localmodel.facts.cpu import parse_cpuinfo
from localmodel.facts.files import MachineFactsError
from localmodel.facts.flags import cpuid_name
from localmodel.facts.machine import HostCalls, from_this_machine
from localmodel.facts.topology import parse_cpu_list

pytestmark = pytest.mark.unit

GiB = 2**30

INTEL_FLAGS = (
    "fpu vme sse sse2 ht pni ssse3 fma sse4_1 sse4_2 aes avx f16c avx2 sha_ni avx512f "
    "avx512bw avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8 pclmulqdq"
)


def cpuinfo(
    n: int = 4,
    *,
    vendor: str = "GenuineIntel",
    flags: str = INTEL_FLAGS,
    siblings: int | None = None,
    cores: int | None = None,
) -> str:
    blocks = []
    for cpu in range(n):
        lines = [
            f"processor\t: {cpu}",
            f"vendor_id\t: {vendor}",
            "cpu family\t: 6",
            "model\t\t: 143",
            "model name\t: Intel(R) Xeon(R) Platinum 8481C",
            f"siblings\t: {siblings if siblings is not None else n}",
            f"cpu cores\t: {cores if cores is not None else n}",
            f"flags\t\t: {flags}",
        ]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def build(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def base(
    cpus: int = 4, allowed: str | None = None, mem_kib: int = 16 * 1024 * 1024
) -> dict[str, str]:
    return {
        "proc/cpuinfo": cpuinfo(cpus),
        "sys/devices/system/cpu/online": f"0-{cpus - 1}\n",
        "proc/self/status": f"Name:\tpython\nCpus_allowed_list:\t{allowed or f'0-{cpus - 1}'}\n",
        "proc/meminfo": f"MemTotal:       {mem_kib} kB\nMemFree:        1000 kB\n",
        "proc/sys/kernel/hostname": "worker-7\n",
    }


def test_fake_machine_without_cgroup_limits_gets_every_cpu(tmp_path: Path) -> None:
    facts = from_this_machine(build(tmp_path, base(4)))
    assert facts.name == "worker-7"
    assert facts.labels == {"kubernetes.io/hostname": "worker-7"}
    assert facts.allocatable_cpu_milli == 4000
    assert facts.cpuset_cpus == 4
    assert facts.cgroup_cpu_quota is None
    assert facts.allocatable_memory_bytes == 16 * GiB
    assert facts.source is FactSource.MACHINE
    assert facts.schedulable is True


@pytest.mark.parametrize(
    ("files", "milli", "quota"),
    [
        ({"sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1500, 1.5),
        ({"sys/fs/cgroup/cpu.max": "max 100000\n"}, 4000, None),
        ({"sys/fs/cgroup/cpu.max": "250000 100000\n"}, 2500, 2.5),
        ({"sys/fs/cgroup/cpu.max": "800000 100000\n"}, 4000, 8.0),  # quota above the CPUs
        ({"sys/fs/cgroup/cpu.max": "33333 100000\n"}, 333, 0.33333),  # floored to a milli
        ({"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000\n",
          "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 2000, 2.0),
        ({"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
          "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 4000, None),
        ({"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
          "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "50000\n"}, 1000, 1.0),
        # hybrid layout: v2 mounted at unified/
        ({"sys/fs/cgroup/unified/cpu.max": "300000 100000\n"}, 3000, 3.0),
        # v1 and v2 both visible: the tighter wins
        ({"sys/fs/cgroup/unified/cpu.max": "300000 100000\n",
          "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "150000\n",
          "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 1500, 1.5),
    ],
)  # fmt: skip
def test_cgroup_quota_limits_the_cpu_budget(
    tmp_path: Path, files: dict[str, str], milli: int, quota: float | None
) -> None:
    facts = from_this_machine(build(tmp_path, {**base(4), **files}))
    assert facts.allocatable_cpu_milli == milli
    assert facts.cgroup_cpu_quota == (pytest.approx(quota) if quota is not None else None)


def test_cpuset_smaller_than_the_quota_wins(tmp_path: Path) -> None:
    files = {**base(8, allowed="2-3"), "sys/fs/cgroup/cpu.max": "400000 100000\n"}
    facts = from_this_machine(build(tmp_path, files))
    assert facts.cpuset_cpus == 2
    assert facts.cgroup_cpu_quota == 4.0  # kept as read, not clipped
    assert facts.allocatable_cpu_milli == 2000


def test_static_cpu_manager_exclusive_cpus_without_quota(tmp_path: Path) -> None:
    # DisableCPUQuotaWithExclusiveCPUs: cpu.max reads max, the cpuset is the limit
    # (docs/engine-facts.md, kubernetes#127525).
    files = {**base(16, allowed="4,5,12,13"), "sys/fs/cgroup/cpu.max": "max 100000\n"}
    facts = from_this_machine(build(tmp_path, files))
    assert facts.cgroup_cpu_quota is None
    assert facts.cpuset_cpus == 4
    assert facts.allocatable_cpu_milli == 4000


def test_the_tightest_ancestor_cgroup_wins(tmp_path: Path) -> None:
    files = {
        **base(8),
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "200000 100000\n",
        "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "sys/fs/cgroup/kubepods/pod1/memory.max": f"{4 * GiB}\n",
        "sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
    }
    facts = from_this_machine(build(tmp_path, files))
    assert facts.allocatable_cpu_milli == 2000
    assert facts.cgroup_cpu_quota == 2.0
    assert facts.allocatable_memory_bytes == 4 * GiB


def test_v1_cgroup_path_from_proc_self_cgroup(tmp_path: Path) -> None:
    files = {
        **base(8),
        "proc/self/cgroup": "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": f"{2 * GiB}\n",
    }
    facts = from_this_machine(build(tmp_path, files))
    assert facts.allocatable_cpu_milli == 3000
    assert facts.allocatable_memory_bytes == 2 * GiB


@pytest.mark.parametrize(
    ("files", "memory"),
    [
        ({"sys/fs/cgroup/memory.max": f"{8 * GiB}\n"}, 8 * GiB),
        ({"sys/fs/cgroup/memory.max": "max\n"}, 16 * GiB),
        ({"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 16 * GiB),
        ({"sys/fs/cgroup/memory/memory.limit_in_bytes": f"{3 * GiB}\n"}, 3 * GiB),
        ({"sys/fs/cgroup/memory.max": f"{64 * GiB}\n"}, 16 * GiB),  # limit above the RAM
    ],
)
def test_cgroup_memory_limit_caps_memory(
    tmp_path: Path, files: dict[str, str], memory: int
) -> None:
    facts = from_this_machine(build(tmp_path, {**base(4), **files}))
    assert facts.allocatable_memory_bytes == memory


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("sys/fs/cgroup/cpu.max", "lots 100000\n"),
        ("sys/fs/cgroup/cpu.max", "100000\n"),
        ("sys/fs/cgroup/cpu.max", "0 100000\n"),
        ("sys/fs/cgroup/memory.max", "eight\n"),
        ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "many\n"),
    ],
)
def test_unreadable_cgroup_files_raise_an_error_naming_the_file(
    tmp_path: Path, name: str, text: str
) -> None:
    root = build(tmp_path, {**base(4), name: text})
    with pytest.raises(MachineFactsError, match=name.rsplit("/", 1)[-1].split(".")[0]):
        from_this_machine(root)


def test_v1_quota_without_a_period_is_an_error(tmp_path: Path) -> None:
    root = build(tmp_path, {**base(4), "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000\n"})
    with pytest.raises(MachineFactsError, match=r"cpu\.cfs_period_us"):
        from_this_machine(root)


def test_missing_files_fall_back_without_inventing_facts(tmp_path: Path) -> None:
    # Only meminfo: no cpuinfo, no online list, no affinity, no cgroups, no hostname.
    root = build(tmp_path, {"proc/meminfo": "MemTotal: 1048576 kB\n"})
    facts = from_this_machine(root)
    assert facts.allocatable_cpu_milli == 1000  # nothing known: one CPU, not zero
    assert facts.cpuset_cpus is None
    assert facts.cgroup_cpu_quota is None
    assert facts.cpu_flags is None
    assert facts.source is FactSource.NONE
    assert facts.has("AVX2") is None
    assert facts.hyperthreading is None
    assert facts.name == "localhost"
    assert facts.allocatable_memory_bytes == GiB


def test_cpu_count_falls_back_to_cpuinfo_processors(tmp_path: Path) -> None:
    files = base(3)
    del files["sys/devices/system/cpu/online"]
    del files["proc/self/status"]
    facts = from_this_machine(build(tmp_path, files))
    assert facts.allocatable_cpu_milli == 3000


def test_cpu_features_from_cpuinfo_use_nfd_names(tmp_path: Path) -> None:
    facts = from_this_machine(build(tmp_path, base(4)))
    assert facts.cpu_flags is not None
    for flag in ["AVX2", "AVX512F", "AVX512VNNI", "AVX512BF16", "AVXVNNI", "AMXTILE",
                 "AMXBF16", "AMXINT8", "FMA3", "F16C", "SSE42", "SSE4", "SSE3", "AESNI",
                 "SHA", "CLMUL"]:  # fmt: skip
        assert facts.has(flag) is True, flag
    assert facts.has("AMXFP16") is False  # machine facts are complete
    assert (facts.cpu_vendor, facts.cpu_family, facts.cpu_model_id) == ("Intel", "6", "143")


@pytest.mark.parametrize(
    ("linux", "nfd"),
    [
        ("avx2", "AVX2"),
        ("avx512f", "AVX512F"),
        ("avx512_vnni", "AVX512VNNI"),
        ("avx512_bf16", "AVX512BF16"),
        ("avx512_fp16", "AVX512FP16"),
        ("avx512vbmi", "AVX512VBMI"),
        ("amx_tile", "AMXTILE"),
        ("amx_bf16", "AMXBF16"),
        ("amx_int8", "AMXINT8"),
        ("amx_fp16", "AMXFP16"),
        ("avx_vnni", "AVXVNNI"),
        ("fma", "FMA3"),
        ("f16c", "F16C"),
        ("avx", "AVX"),
        ("sse4_1", "SSE4"),
        ("sse4_2", "SSE42"),
        ("pni", "SSE3"),
        ("aes", "AESNI"),
        ("sha_ni", "SHA"),
        ("ht", "HTT"),
    ],
)
def test_linux_flag_names_map_to_nfd_names(linux: str, nfd: str) -> None:
    assert cpuid_name(linux) == nfd


@pytest.mark.parametrize(
    ("vendor", "expected"),
    [("GenuineIntel", "Intel"), ("AuthenticAMD", "AMD"), ("HygonGenuine", "Hygon"),
     ("CentaurHauls", "CentaurHauls")],
)  # fmt: skip
def test_vendor_names_follow_nfd(vendor: str, expected: str) -> None:
    assert parse_cpuinfo(cpuinfo(1, vendor=vendor)).vendor == expected


@pytest.mark.parametrize(
    ("siblings", "cores", "smt_active", "expected"),
    [
        (8, 4, None, True),
        (4, 4, None, False),  # the "ht" flag is set, but there is no SMT
        (8, 4, "0\n", False),  # the kernel's SMT switch wins
        (4, 4, "1\n", True),
    ],
)
def test_hyperthreading_from_topology_not_the_ht_flag(
    tmp_path: Path, siblings: int, cores: int, smt_active: str | None, expected: bool
) -> None:
    files = {**base(8), "proc/cpuinfo": cpuinfo(8, siblings=siblings, cores=cores)}
    if smt_active is not None:
        files["sys/devices/system/cpu/smt/active"] = smt_active
    facts = from_this_machine(build(tmp_path, files))
    assert facts.hyperthreading is expected


def test_arm_cpuinfo_features_are_read() -> None:
    text = (
        "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd aes sve\nCPU implementer\t: 0x41\n"
    )
    info = parse_cpuinfo(text)
    assert info.flags == frozenset({"FP", "ASIMD", "AESNI", "SVE"})
    assert info.vendor is None


def test_only_the_first_processor_block_counts() -> None:
    text = cpuinfo(1) + "processor\t: 1\nflags\t\t: avx512f amx_tile fpu\n"
    assert parse_cpuinfo(cpuinfo(1, flags="fpu avx2")).flags == frozenset({"FPU", "AVX2"})
    assert "AMXTILE" in (parse_cpuinfo(text).flags or frozenset())


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3", {0, 1, 2, 3}), ("0-1,8,10-11\n", {0, 1, 8, 10, 11}), ("5", {5}), ("", set())],
)
def test_parse_cpu_list(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "-1", "0-"])
def test_parse_cpu_list_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpu_list(bad)


def test_injected_host_calls_replace_the_system_calls(tmp_path: Path) -> None:
    root = build(tmp_path, {"sys/fs/cgroup/cpu.max": "350000 100000\n"})
    host = HostCalls(
        cpu_count=lambda: 64,
        affinity=lambda: set(range(8)),
        total_memory=lambda: 32 * GiB,
        hostname=lambda: "injected",
    )
    facts = from_this_machine(root, host=host)
    assert facts.name == "injected"
    assert facts.labels == {"kubernetes.io/hostname": "injected"}
    assert facts.cpuset_cpus == 8
    assert facts.allocatable_cpu_milli == 3500
    assert facts.allocatable_memory_bytes == 32 * GiB


@settings(max_examples=40, deadline=None)
@given(
    cpus=st.integers(min_value=1, max_value=256),
    allowed=st.integers(min_value=1, max_value=256),
    quota=st.one_of(st.none(), st.integers(min_value=1000, max_value=10**8)),
    period=st.integers(min_value=1000, max_value=10**6),
    v1=st.booleans(),
)
def test_budget_is_the_min_of_cpus_cpuset_and_quota(
    cpus: int, allowed: int, quota: int | None, period: int, v1: bool
) -> None:
    allowed = min(allowed, cpus)
    files = base(cpus, allowed=f"0-{allowed - 1}")
    if quota is not None:
        if v1:
            files["sys/fs/cgroup/cpu/cpu.cfs_quota_us"] = f"{quota}\n"
            files["sys/fs/cgroup/cpu/cpu.cfs_period_us"] = f"{period}\n"
        else:
            files["sys/fs/cgroup/cpu.max"] = f"{quota} {period}\n"
    with tempfile.TemporaryDirectory() as tmp:
        facts = from_this_machine(build(Path(tmp), files))
    expected = min(cpus * 1000, allowed * 1000)
    if quota is not None:
        expected = min(expected, quota * 1000 // period)
        assert facts.cgroup_cpu_quota == pytest.approx(quota / period)
    else:
        assert facts.cgroup_cpu_quota is None
    assert facts.allocatable_cpu_milli == expected
    assert facts.allocatable_cpu_milli <= (facts.cpuset_cpus or 0) * 1000
    # Threads derived from the budget never exceed the quota
    # (docs/engine-facts.md, "Threads and the CPU budget").
    if facts.cgroup_cpu_quota is not None:
        assert facts.allocatable_cpus <= facts.cgroup_cpu_quota


# --- the real machine -------------------------------------------------------


def _real_cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc")
def test_real_machine_is_consistent_with_affinity_and_cpuinfo() -> None:
    facts = from_this_machine()
    affinity = os.sched_getaffinity(0)
    assert facts.cpuset_cpus == len(affinity)
    assert 0 < facts.allocatable_cpu_milli <= len(affinity) * 1000
    if facts.cgroup_cpu_quota is None:
        assert facts.allocatable_cpu_milli == min(len(affinity), os.cpu_count() or 1) * 1000
    linux = _real_cpuinfo_flags()
    assert facts.source is FactSource.MACHINE
    for linux_name, nfd in [("avx2", "AVX2"), ("avx512f", "AVX512F"), ("amx_tile", "AMXTILE"),
                            ("avx512_vnni", "AVX512VNNI"), ("fma", "FMA3")]:  # fmt: skip
        assert facts.has(nfd) is (linux_name in linux), nfd
    assert (
        0
        < facts.allocatable_memory_bytes
        <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + 2**20
    )
    # The same facts read back through the file-based host calls agree.
    from_files = from_this_machine(host=HostCalls.from_files(Path("/")))
    assert from_files.cpuset_cpus == facts.cpuset_cpus
    assert from_files.allocatable_cpu_milli == facts.allocatable_cpu_milli
    assert from_files.cpu_flags == facts.cpu_flags
