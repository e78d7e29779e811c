"""The labels our node probe puts on its node (``localmodel.dev/cpu...``).

They are the inverse of what `localmodel.facts.node.from_node` reads, so a node
without NFD still gets its CPU features known:

- ``localmodel.dev/cpu-flags-known: "true"``: the ``cpu.*`` labels are complete
  for ``PROBE_CPU_FLAGS``;
- ``localmodel.dev/cpu.<FLAG>: "true"``: one per flag of ``PROBE_CPU_FLAGS`` the
  CPU has (``cpu.AVX2``, ``cpu.AMXTILE``...);
- ``localmodel.dev/cpu-vendor``: ``Intel``, ``AMD``... (NFD's spelling);
- ``localmodel.dev/cpu-family``, ``localmodel.dev/cpu-model-id``: CPUID family
  and model, decimal;
- ``localmodel.dev/cpu-hyperthreading``: ``"true"`` / ``"false"``;
- ``localmodel.dev/cpu-physical-cores``, ``localmodel.dev/cpu-threads-per-core``
  (1 = no SMT), ``localmodel.dev/numa-nodes``: counts, decimal.

- ``localmodel.dev/memory-bandwidth-1-thread``, ``localmodel.dev/memory-bandwidth``,
  ``localmodel.dev/memory-bandwidth-threads``: the memory read bandwidth the probe
  measured (`bandwidth_labels`), MB/s at one thread and at that many threads.

Absent flags get no label (the node stays small); ``cpu-flags-known`` is what
makes their absence mean "not present" rather than "unknown". Flags outside
``PROBE_CPU_FLAGS`` stay unknown. A value that is not a valid label value (at
most 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at both ends) is left out
rather than mangled, so it reads back as unknown.
"""

from __future__ import annotations

from localmodel.facts.flags import PROBE_CPU_FLAGS
from localmodel.facts.model import MemoryBandwidth, NodeFacts
from localmodel.facts.node import (
    MB,
    PROBE_BANDWIDTH_ALL,
    PROBE_BANDWIDTH_ONE,
    PROBE_BANDWIDTH_THREADS,
    PROBE_FAMILY,
    PROBE_FLAG,
    PROBE_FLAGS_KNOWN,
    PROBE_HYPERTHREADING,
    PROBE_MODEL_ID,
    PROBE_NUMA_NODES,
    PROBE_PHYSICAL_CORES,
    PROBE_PREFIX,
    PROBE_THREADS_PER_CORE,
    PROBE_VENDOR,
    is_label_value,
)

__all__ = ["PROBE_PREFIX", "bandwidth_labels", "is_label_value", "probe_labels"]


def probe_labels(facts: NodeFacts) -> dict[str, str]:
    """The ``localmodel.dev/`` labels describing ``facts``' CPU, for its node.

    Unknown facts produce no label, so they read back as unknown.
    """
    labels: dict[str, str] = {}
    if facts.cpu_flags is not None:
        labels[PROBE_FLAGS_KNOWN] = "true"
        for flag in PROBE_CPU_FLAGS:
            if flag in facts.cpu_flags:
                labels[PROBE_FLAG + flag] = "true"
    for key, value in (
        (PROBE_VENDOR, facts.cpu_vendor),
        (PROBE_FAMILY, facts.cpu_family),
        (PROBE_MODEL_ID, facts.cpu_model_id),
    ):
        if value and is_label_value(value):
            labels[key] = value
    if facts.hyperthreading is not None:
        labels[PROBE_HYPERTHREADING] = "true" if facts.hyperthreading else "false"
    for key, count in (
        (PROBE_PHYSICAL_CORES, facts.physical_cores),
        (PROBE_THREADS_PER_CORE, facts.threads_per_core),
        (PROBE_NUMA_NODES, facts.numa_nodes),
    ):
        if count:
            labels[key] = str(count)
    return labels


def bandwidth_labels(bandwidth: MemoryBandwidth) -> dict[str, str]:
    """The labels of a measured memory bandwidth: MB/s, whole (at least 1)."""
    labels = {PROBE_BANDWIDTH_ONE: str(max(1, round(bandwidth.one_thread / MB)))}
    if bandwidth.all_threads is not None and bandwidth.threads is not None:
        labels[PROBE_BANDWIDTH_ALL] = str(max(1, round(bandwidth.all_threads / MB)))
        labels[PROBE_BANDWIDTH_THREADS] = str(bandwidth.threads)
    return labels
