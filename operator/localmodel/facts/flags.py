"""CPU feature names: one spelling for every source, and what each source can vouch for.

The canonical spelling is NFD's: the upper-case feature names of the
klauspost/cpuid library that nfd-worker labels as
``feature.node.kubernetes.io/cpu-cpuid.<NAME>`` (``AVX2``, ``AVX512VNNI``,
``AMXTILE``, ``FMA3``...). Linux ``/proc/cpuinfo`` spells most of them in lower
case with underscores (``avx512_vnni``, ``amx_tile``); the few that differ by more
than that are listed in ``_LINUX_RENAMES``.
"""

from __future__ import annotations

__all__ = [
    "NFD_UNLABELLED_BY_DEFAULT",
    "PROBE_CPU_FLAGS",
    "cpuid_name",
]

# /proc/cpuinfo names whose klauspost/cpuid (NFD) name is not simply the upper-case
# name without underscores.
_LINUX_RENAMES = {
    "fma": "FMA3",
    "pni": "SSE3",
    "sse4_1": "SSE4",  # klauspost/cpuid calls SSE4.1 "SSE4"
    "sse4_2": "SSE42",
    "aes": "AESNI",
    "sha_ni": "SHA",
    "pclmulqdq": "CLMUL",
    "ht": "HTT",
}


def cpuid_name(linux_flag: str) -> str:
    """The NFD spelling of a ``/proc/cpuinfo`` flag: ``avx512_vnni`` -> ``AVX512VNNI``."""
    flag = linux_flag.strip().lower()
    return _LINUX_RENAMES.get(flag) or flag.replace("_", "").upper()


# nfd-worker's default `sources.cpu.cpuid.attributeBlacklist`: these features are
# never labelled unless the cluster's NFD config says otherwise, so on an NFD node
# a missing label for them proves nothing (unknown, not absent). Union of the old
# ("SSE4.1") and current ("SSE4") spellings, in our canonical spelling.
NFD_UNLABELLED_BY_DEFAULT: frozenset[str] = frozenset(
    {
        "AVX10",
        "BMI1",
        "BMI2",
        "CLMUL",
        "CMOV",
        "CX16",
        "ERMS",
        "F16C",
        "HTT",
        "LZCNT",
        "MMX",
        "MMXEXT",
        "NX",
        "POPCNT",
        "RDRAND",
        "RDSEED",
        "RDTSCP",
        "SGX",
        "SGXLC",
        "SSE",
        "SSE2",
        "SSE3",
        "SSE4",
        "SSE42",
        "SSSE3",
        "TDXGUEST",
    }
)

# The features our node probe labels (``localmodel.dev/cpu.<NAME>``), the only
# place this list lives. These are the x86 features that decide which ggml CPU
# backend an engine picks (SSE4.2 -> AVX -> AVX2/FMA/F16C -> AVX-512 family ->
# AMX) and therefore which tuning rules apply. Nodes stay small: one label per
# feature the CPU has. A feature not in this list is *unknown* on a node known
# only through probe labels. Append only: renaming breaks labelled nodes.
PROBE_CPU_FLAGS: tuple[str, ...] = (
    "SSE42",
    "AVX",
    "AVX2",
    "FMA3",
    "F16C",
    "AVXVNNI",
    "AVX512F",
    "AVX512BW",
    "AVX512CD",
    "AVX512DQ",
    "AVX512VL",
    "AVX512VBMI",
    "AVX512VNNI",
    "AVX512BF16",
    "AVX512FP16",
    "AMXTILE",
    "AMXINT8",
    "AMXBF16",
    "AMXFP16",
)
