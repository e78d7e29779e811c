"""What the CPU is: the first processor of /proc/cpuinfo (in NFD's spelling),
and whether this kernel offers AMX to user space."""

from __future__ import annotations

import ctypes
import platform
from dataclasses import dataclass
from enum import StrEnum

from localmodel.facts.flags import cpuid_name

# cpuinfo vendor_id -> the vendor names NFD uses (cpu-model.vendor_id).
_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon"}


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the first CPU."""

    flags: frozenset[str] | None = None  # NFD spelling; None = no flags line
    vendor: str | None = None
    family: str | None = None
    model_id: str | None = None
    siblings: int | None = None  # logical CPUs per package
    cores: int | None = None  # physical cores per package
    model_name: str | None = None  # "Intel(R) Xeon(R) Platinum 8481C"


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor block of /proc/cpuinfo (x86 names; ARM's "Features")."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    raw_flags = fields.get("flags", fields.get("Features"))
    vendor = fields.get("vendor_id")
    return CpuInfo(
        flags=None if raw_flags is None else frozenset(map(cpuid_name, raw_flags.split())),
        vendor=_VENDORS.get(vendor, vendor) if vendor else None,
        family=fields.get("cpu family") or None,
        model_id=fields.get("model") or None,
        siblings=_optional_int(fields.get("siblings")),
        cores=_optional_int(fields.get("cpu cores")),
        model_name=fields.get("model name") or None,
    )


def _optional_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# arch_prctl(2) codes (Linux arch/x86/include/uapi/asm/prctl.h) and the AMX tile
# data state component (XFEATURE_XTILEDATA, bit 18): the kernel offers AMX to user
# space only when ARCH_GET_XCOMP_SUPP's mask has it; a process must then ask for it
# with ARCH_REQ_XCOMP_PERM (Linux Documentation/arch/x86/xstate.rst).
_SYS_ARCH_PRCTL_X86_64 = 158
_ARCH_GET_XCOMP_SUPP = 0x1021
_XFEATURE_XTILEDATA = 18


class AmxKernel(StrEnum):
    """Whether this kernel lets user space use AMX (ARCH_GET_XCOMP_SUPP)."""

    OFFERED = "offered"  # the XTILEDATA bit is in the supported mask
    NOT_OFFERED = "not-offered"  # arch_prctl answers, without XTILEDATA
    NO_XCOMP = "no-arch-prctl-xcomp"  # arch_prctl refuses the code: kernel before 5.16
    NOT_X86 = "not-x86"  # no such thing here


def kernel_amx() -> AmxKernel:
    """Ask this kernel (a container shares its node's) through arch_prctl(2)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return AmxKernel.NOT_X86
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_uint64(0)
        result = libc.syscall(_SYS_ARCH_PRCTL_X86_64, _ARCH_GET_XCOMP_SUPP, ctypes.byref(mask))
    except (OSError, AttributeError):
        return AmxKernel.NO_XCOMP
    if result != 0:
        return AmxKernel.NO_XCOMP
    return AmxKernel.OFFERED if mask.value >> _XFEATURE_XTILEDATA & 1 else AmxKernel.NOT_OFFERED
