"""NodeFacts from Kubernetes Node objects, as `kubectl get node(s) -o yaml` prints them.

Pure: takes the already-loaded dict, returns values. CPU features come from two
label sets, and NFD wins wherever both say something:

- NFD (node-feature-discovery): ``feature.node.kubernetes.io/cpu-cpuid.<FLAG>:
  "true"``, ``cpu-model.vendor_id|family|id``, ``cpu-hardware_multithreading``.
  Any ``feature.node.kubernetes.io/cpu-`` label means NFD's CPU source ran, so
  the cpuid labels are its whole answer (even if there are none).
- our probe (``localmodel.dev/``, see `localmodel.probe.labels`):
  ``cpu-flags-known: "true"`` marks the flag set as complete for
  ``PROBE_CPU_FLAGS``; ``cpu.<FLAG>: "true"`` per present flag; ``cpu-vendor``,
  ``cpu-family``, ``cpu-model-id``, ``cpu-hyperthreading``; topology:
  ``cpu-physical-cores``, ``cpu-threads-per-core``, ``numa-nodes``; the memory
  bandwidth it measured (`bandwidth_from_labels`): ``memory-bandwidth-1-thread``,
  ``memory-bandwidth`` and ``memory-bandwidth-threads``.

No CPU labels at all means the features are unknown (``cpu_flags=None``,
``source=NONE``), never that they are absent.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from localmodel.contract import PREFIX
from localmodel.facts.model import FactSource, MemoryBandwidth, NodeFacts, Taint
from localmodel.facts.quantity import parse_bytes, parse_cpu_milli

__all__ = [
    "NFD_PREFIX",
    "PROBE_PREFIX",
    "NodeFactsError",
    "bandwidth_from_labels",
    "from_node",
    "from_node_list",
    "is_label_value",
]

NFD_PREFIX = "feature.node.kubernetes.io/"
NFD_CPU = NFD_PREFIX + "cpu-"
NFD_CPUID = NFD_PREFIX + "cpu-cpuid."
NFD_VENDOR = NFD_PREFIX + "cpu-model.vendor_id"
NFD_FAMILY = NFD_PREFIX + "cpu-model.family"
NFD_MODEL_ID = NFD_PREFIX + "cpu-model.id"
NFD_MULTITHREADING = NFD_PREFIX + "cpu-hardware_multithreading"

PROBE_PREFIX = PREFIX  # the node probe's labels and annotations (localmodel.contract)
PROBE_FLAGS_KNOWN = PROBE_PREFIX + "cpu-flags-known"
PROBE_FLAG = PROBE_PREFIX + "cpu."
PROBE_VENDOR = PROBE_PREFIX + "cpu-vendor"
PROBE_FAMILY = PROBE_PREFIX + "cpu-family"
PROBE_MODEL_ID = PROBE_PREFIX + "cpu-model-id"
PROBE_HYPERTHREADING = PROBE_PREFIX + "cpu-hyperthreading"
PROBE_PHYSICAL_CORES = PROBE_PREFIX + "cpu-physical-cores"
PROBE_THREADS_PER_CORE = PROBE_PREFIX + "cpu-threads-per-core"
PROBE_NUMA_NODES = PROBE_PREFIX + "numa-nodes"
# The memory bandwidth the probe measured, in MB/s (10^6 bytes per second, decimal):
# one thread's, and that of `-threads` threads together.
PROBE_BANDWIDTH_ONE = PROBE_PREFIX + "memory-bandwidth-1-thread"
PROBE_BANDWIDTH_ALL = PROBE_PREFIX + "memory-bandwidth"
PROBE_BANDWIDTH_THREADS = PROBE_PREFIX + "memory-bandwidth-threads"
PROBE_BANDWIDTH_KEYS = (PROBE_BANDWIDTH_ONE, PROBE_BANDWIDTH_ALL, PROBE_BANDWIDTH_THREADS)
MB = 1000**2
# Bounds of a believable value: 10 TB/s is past any CPU's memory (HBM parts reach ~1 TB/s),
# and no node has more threads than the planner's own bound on CPUs.
MAX_BANDWIDTH_MB_S = 10_000_000
MAX_BANDWIDTH_THREADS = 4096
# The annotation with the probe's full facts as JSON (see `localmodel.probe`).
PROBE_FACTS_ANNOTATION = PROBE_PREFIX + "node-facts"

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid Kubernetes label value (<= 63 chars, [A-Za-z0-9_.-],
    alphanumeric at both ends, or empty)."""
    return _LABEL_VALUE.fullmatch(value) is not None


class NodeFactsError(ValueError):
    """An invalid Node object; the message starts with the field path."""


def _fail(path: str, message: str) -> NodeFactsError:
    return NodeFactsError(f"{path}: {message}" if path else message)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _mapping(value: Any, path: str, *, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise _fail(path, "missing")
        return {}
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected a mapping, got {type(value).__name__}")
    return value


def from_node(node: Mapping[str, Any], *, path: str = "") -> NodeFacts:
    """NodeFacts from one Node object (a dict, as YAML or the API returns it).

    ``path`` prefixes the field paths in error messages (``items[2]``).
    Raises NodeFactsError naming the field path when the object is invalid.
    """
    if not isinstance(node, Mapping):
        raise _fail(path, f"expected a Node object, got {type(node).__name__}")
    kind = node.get("kind")
    if kind is not None and kind != "Node":
        raise _fail(_join(path, "kind"), f"expected Node, got {kind!r}")

    metadata = _mapping(node.get("metadata"), _join(path, "metadata"), required=True)
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(_join(path, "metadata.name"), "missing or not a non-empty string")
    labels = _labels(metadata.get("labels"), _join(path, "metadata.labels"))

    spec = _mapping(node.get("spec"), _join(path, "spec"))
    taints = _taints(spec.get("taints"), _join(path, "spec.taints"))
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        raise _fail(_join(path, "spec.unschedulable"), f"{unschedulable!r} is not a boolean")

    status = _mapping(node.get("status"), _join(path, "status"), required=True)
    cpu_milli = _resource(status, "cpu", _join(path, "status"), parse_cpu_milli, "CPU")
    memory = _resource(status, "memory", _join(path, "status"), parse_bytes, "memory")

    cpu = _cpu_facts(labels)
    return NodeFacts(
        name=name,
        allocatable_cpu_milli=cpu_milli,
        allocatable_memory_bytes=memory,
        labels=labels,
        taints=taints,
        cpu_flags=cpu.flags,
        source=cpu.source,
        cpu_vendor=cpu.vendor,
        cpu_family=cpu.family,
        cpu_model_id=cpu.model_id,
        hyperthreading=cpu.hyperthreading,
        schedulable=not unschedulable,
        physical_cores=_count_label(labels.get(PROBE_PHYSICAL_CORES)),
        threads_per_core=_count_label(labels.get(PROBE_THREADS_PER_CORE)),
        numa_nodes=_count_label(labels.get(PROBE_NUMA_NODES)),
        memory_bandwidth=bandwidth_from_labels(labels)[0],
    )


def bandwidth_from_labels(labels: Mapping[str, str]) -> tuple[MemoryBandwidth | None, str]:
    """The probe's memory bandwidth from a node's labels, and why a part of it was ignored ("":
    nothing was). Labels are the probe's, so hostile until checked: a value that is not a
    bounded decimal count is left out with its reason, never an error. No one-thread number,
    no bandwidth; an all-threads number without a valid thread count, one thread only."""
    if not any(key in labels for key in PROBE_BANDWIDTH_KEYS):
        return None, ""
    one = _bounded(labels.get(PROBE_BANDWIDTH_ONE), MAX_BANDWIDTH_MB_S)
    if one is None:
        return None, _ignored(PROBE_BANDWIDTH_ONE, labels, MAX_BANDWIDTH_MB_S)
    if PROBE_BANDWIDTH_ALL not in labels and PROBE_BANDWIDTH_THREADS not in labels:
        return MemoryBandwidth(one * MB), ""
    every = _bounded(labels.get(PROBE_BANDWIDTH_ALL), MAX_BANDWIDTH_MB_S)
    threads = _bounded(labels.get(PROBE_BANDWIDTH_THREADS), MAX_BANDWIDTH_THREADS)
    if every is None:
        return MemoryBandwidth(one * MB), _ignored(PROBE_BANDWIDTH_ALL, labels,
                                                   MAX_BANDWIDTH_MB_S)
    if threads is None:
        return MemoryBandwidth(one * MB), _ignored(PROBE_BANDWIDTH_THREADS, labels,
                                                   MAX_BANDWIDTH_THREADS)
    return MemoryBandwidth(one * MB, every * MB, threads), ""


def _bounded(value: str | None, most: int) -> int | None:
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 9:
        return None
    number = int(value)
    return number if 0 < number <= most else None


def _ignored(key: str, labels: Mapping[str, str], most: int) -> str:
    value = labels.get(key)
    # A repr spells an unprintable character in up to 10: bound the spelling, not the text.
    shown = "missing" if value is None else repr(value[:70])[:72]
    return f"{key} {shown} is not a whole number from 1 to {most}: ignored"


def from_node_list(obj: Mapping[str, Any] | Sequence[Any]) -> list[NodeFacts]:
    """NodeFacts for every Node in a ``kind: List``/``NodeList`` object, a single
    Node, or a sequence of documents (multi-document YAML, each a Node or a List;
    empty documents are skipped). Node names must be unique.
    """
    result: list[NodeFacts] = []
    seen: dict[str, str] = {}
    for node, path in _nodes(obj, ""):
        facts = from_node(node, path=path)
        if facts.name in seen:
            raise _fail(
                _join(path, "metadata.name"),
                f"duplicate node name {facts.name!r} (also at {seen[facts.name] or 'top level'})",
            )
        seen[facts.name] = path
        result.append(facts)
    return result


def _nodes(obj: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(obj, Mapping):
        kind = obj.get("kind")
        if kind in ("List", "NodeList") or (kind is None and "items" in obj):
            items = obj.get("items")
            if items is None:
                return
            if isinstance(items, str | bytes) or not isinstance(items, Sequence):
                raise _fail(_join(path, "items"), "expected a list of Node objects")
            for index, item in enumerate(items):
                yield item, f"{_join(path, 'items')}[{index}]"
        else:
            yield obj, path
    elif isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        for index, document in enumerate(obj):
            if document is None:  # an empty YAML document ("---" at the end)
                continue
            yield from _nodes(document, f"{path}[{index}]")
    else:
        raise _fail(path, f"expected a Node, a List of Nodes or a list of documents, got {obj!r}")


def _labels(value: Any, path: str) -> dict[str, str]:
    labels = _mapping(value, path)
    for key, label_value in labels.items():
        if not isinstance(key, str):
            raise _fail(path, f"label key {key!r} is not a string")
        if not isinstance(label_value, str):
            raise _fail(
                f"{path}[{key!r}]",
                f"{label_value!r} is not a string (label values are strings: quote it)",
            )
    # A plain dict is used as it is (the operator's watches keep one per node,
    # and NodeFacts never changes it): a copy per node was 13 MiB at 10k nodes.
    return labels if type(labels) is dict else dict(labels)


def _taints(value: Any, path: str) -> tuple[Taint, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise _fail(path, "expected a list of taints")
    taints = []
    for index, raw in enumerate(value):
        here = f"{path}[{index}]"
        taint = _mapping(raw, here, required=True)
        key = taint.get("key")
        if not isinstance(key, str) or not key:
            raise _fail(f"{here}.key", "missing or not a non-empty string")
        taint_value = taint.get("value", "")
        if taint_value is None:
            taint_value = ""
        if not isinstance(taint_value, str):
            raise _fail(f"{here}.value", f"{taint_value!r} is not a string")
        effect = taint.get("effect")
        if effect not in _TAINT_EFFECTS:
            raise _fail(f"{here}.effect", f"{effect!r} is not one of {', '.join(_TAINT_EFFECTS)}")
        taints.append(Taint(key=key, value=taint_value, effect=effect))
    return tuple(taints)


def _resource(
    status: Mapping[str, Any],
    resource: str,
    path: str,
    parse: Callable[[str | int | float], int],
    what: str,
) -> int:
    # kubectl always prints allocatable; capacity is the fallback for hand-written
    # nodes (and kwok fakes) that only state capacity.
    for field in ("allocatable", "capacity"):
        section = _mapping(status.get(field), f"{path}.{field}")
        raw = section.get(resource)
        if raw is None:
            continue
        try:
            return parse(raw)
        except ValueError:
            raise _fail(
                f"{path}.{field}.{resource}", f"{_show(raw)} is not a {what} quantity"
            ) from None
    raise _fail(
        f"{path}.allocatable.{resource}",
        f"missing (neither status.allocatable.{resource} nor status.capacity.{resource} is set)",
    )


def _show(raw: Any) -> str:
    return f'"{raw}"' if isinstance(raw, str) else repr(raw)


class _CpuFacts(NamedTuple):
    """What is known of a node's CPU (flags, vendor, family, model, hyperthreading) and where it
    was read."""

    flags: frozenset[str] | None
    source: FactSource
    vendor: str | None
    family: str | None
    model_id: str | None
    hyperthreading: bool | None


def _cpu_facts(labels: Mapping[str, str]) -> _CpuFacts:
    flags: frozenset[str] | None = None
    source = FactSource.NONE
    if any(key.startswith(NFD_CPU) for key in labels):
        flags = _flags(labels, NFD_CPUID)
        source = FactSource.NFD
    elif labels.get(PROBE_FLAGS_KNOWN) == "true":
        flags = _flags(labels, PROBE_FLAG)
        source = FactSource.PROBE
    # Field by field, NFD first, then the probe.
    hyperthreading = _bool_label(labels.get(NFD_MULTITHREADING))
    if hyperthreading is None:
        hyperthreading = _bool_label(labels.get(PROBE_HYPERTHREADING))
    return _CpuFacts(
        flags=flags,
        source=source,
        vendor=labels.get(NFD_VENDOR) or labels.get(PROBE_VENDOR) or None,
        family=labels.get(NFD_FAMILY) or labels.get(PROBE_FAMILY) or None,
        model_id=labels.get(NFD_MODEL_ID) or labels.get(PROBE_MODEL_ID) or None,
        hyperthreading=hyperthreading,
    )


# Nodes of one machine type carry the same flag set: one frozenset serves them
# all (at 10 000 nodes, one each took about 18 MiB). Bounded: a cluster has few.
_FLAG_SETS: dict[frozenset[str], frozenset[str]] = {}
_FLAG_SETS_MAX = 4096


def _flags(labels: Mapping[str, str], prefix: str) -> frozenset[str]:
    flags = frozenset(
        sys.intern(key.removeprefix(prefix).upper())
        for key, value in labels.items()
        if key.startswith(prefix) and value == "true"
    )
    shared = _FLAG_SETS.get(flags)
    if shared is not None:
        return shared
    if len(_FLAG_SETS) < _FLAG_SETS_MAX:
        _FLAG_SETS[flags] = flags
    return flags


def _bool_label(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"true": True, "false": False}.get(value.lower())


def _count_label(value: str | None) -> int | None:
    """A positive count label ("16"); anything else reads as unknown."""
    if value is None or not value.isdigit():
        return None
    count = int(value)
    return count if count > 0 else None
