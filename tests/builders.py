"""The tests' inputs, built one way: a LocalModel and a node.

In the style of LeaderWorkerSet's test wrappers
(``MakeLeaderWorkerSet("name").Replica(2).Obj()``): start from a name, say only
what the test is about, and end with what the test needs:

    MakeLocalModel("chat").cpu(2).replicas(2).obj()         # a LocalModel (namespace ai)
    MakeLocalModel("chat", "ns").spec(kvCache="q8_0").manifest()  # its object, unparsed
    MakeNode("n1").cpus(8).cpu_flags("AVX2").facts()        # NodeFacts
    MakeNode("n1").uid("uid-n1").manifest()                 # a Node object

Builders are values: every method returns a new builder, so a module can keep
a base (``GEMMA = MakeLocalModel("g").spec(model="gemma3:270m")``) and each
test refine it without touching the others.

`MakeLocalModel.obj` parses with `parse_local_model`, the operator's own path
(nulls dropped as the API server drops them, errors as `InvalidObject`), never
`LocalModel.model_validate` directly. A test that means to build an unparsed
or invalid object takes `manifest()` and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel, parse_local_model
from localmodel.facts import FactSource, NodeFacts, Taint
from localmodel.facts.node import NFD_CPU
from localmodel.speed import PeerKey

GiB = 1024**3
Manifest = dict[str, Any]

DEFAULT_NAMESPACE = "ai"
DEFAULT_MODEL = "qwen3:1.7b"
# The cached Gemma 3 270M GGUF the engine tiers run (its sha256 is the file's).
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_URL = "https://models.example/gemma-3-270m-q4_k_m.gguf"
# The replicas whose speeds are compared (localmodel/speed.py): model, image,
# CPU limit, CPU (vendor, family, model).
XEON = ("GenuineIntel", "6", "143")
PEER_KEY = PeerKey("gemma3:270m", "img", 1, XEON)


class _Keep:
    """The default of an argument whose None means something."""


_KEEP = _Keep()


@dataclass(frozen=True)
class MakeLocalModel:
    """A LocalModel: metadata and spec, `obj()` parsed, `manifest()` as written."""

    name: str
    _namespace: str | None = DEFAULT_NAMESPACE
    _meta: Mapping[str, Any] = field(default_factory=dict)
    _spec: Mapping[str, Any] = field(default_factory=lambda: {"model": DEFAULT_MODEL})

    # ---- metadata ---------------------------------------------------------------

    def named(self, name: str, namespace: str | _Keep | None = _KEEP) -> MakeLocalModel:
        """Another name (and namespace, when given)."""
        if isinstance(namespace, _Keep):
            return dataclasses.replace(self, name=name)
        return dataclasses.replace(self, name=name, _namespace=namespace)

    def namespace(self, namespace: str | None) -> MakeLocalModel:
        """None: no namespace (the object is created in the request's)."""
        return dataclasses.replace(self, _namespace=namespace)

    def uid(self, uid: str | None) -> MakeLocalModel:
        return self.meta(uid=uid)

    def generation(self, generation: int) -> MakeLocalModel:
        return self.meta(generation=generation)

    def meta(self, **fields: Any) -> MakeLocalModel:
        """Metadata fields (`uid`, `generation`, `labels`...); None removes one."""
        meta = {k: v for k, v in {**self._meta, **fields}.items() if v is not None}
        return dataclasses.replace(self, _meta=meta)

    # ---- spec -------------------------------------------------------------------

    def spec(self, **fields: Any) -> MakeLocalModel:
        """Spec fields by their API names (`kvCache`, `placement`...), replacing
        whole top-level fields."""
        return dataclasses.replace(self, _spec={**self._spec, **fields})

    def without(self, *fields: str) -> MakeLocalModel:
        """The spec without these top-level fields (their defaults apply)."""
        return dataclasses.replace(
            self, _spec={k: v for k, v in self._spec.items() if k not in fields}
        )

    def model(self, tag: str) -> MakeLocalModel:
        return self.spec(model=tag)

    def cpu(self, cpu: int | str) -> MakeLocalModel:
        return self.spec(cpu=cpu)

    def replicas(self, replicas: int) -> MakeLocalModel:
        return self.spec(replicas=replicas)

    def context(self, context: int) -> MakeLocalModel:
        return self.spec(context=context)

    def engine(self, name: str, **fields: Any) -> MakeLocalModel:
        return self.spec(engine={"name": name, **fields})

    def gguf(self, url: str = GEMMA_URL, sha256: str = GEMMA_SHA256, **fields: Any
             ) -> MakeLocalModel:
        return self.spec(gguf={"url": url, "sha256": sha256, **fields})

    # ---- the result -------------------------------------------------------------

    def manifest(self) -> Manifest:
        """The object as a user writes it (or the API server stores it): unparsed."""
        meta: Manifest = {"name": self.name}
        if self._namespace is not None:
            meta["namespace"] = self._namespace
        meta.update(self._meta)
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta,
                "spec": dict(self._spec)}

    def obj(self) -> LocalModel:
        """The LocalModel as the operator reads it (`parse_local_model`)."""
        return parse_local_model(self.manifest())


def cpu_quantity(milli: int) -> str:
    """Kubernetes' spelling of a CPU quantity: whole CPUs or millicores."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(size: int) -> str:
    """Kubernetes' spelling of a memory quantity: Gi, Mi, Ki or bytes."""
    for unit, scale in (("Gi", GiB), ("Mi", 1024**2), ("Ki", 1024)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


@dataclass(frozen=True)
class MakeNode:
    """A node: `facts()` as the facts layer gives it, `manifest()` as the API server
    holds the Node. CPU features set with `cpu_flags` are known from NFD unless
    another source is said; the manifest carries them as NFD labels."""

    name: str
    _cpu_milli: int = 16000
    _memory_bytes: int = 64 * GiB
    _labels: Mapping[str, str] = field(default_factory=dict)
    _taints: tuple[Taint, ...] = ()
    _flags: frozenset[str] | None = None
    _source: FactSource = FactSource.NONE
    _schedulable: bool = True
    _uid: str | None = None
    _registered: bool = False
    _annotations: Mapping[str, str] = field(default_factory=dict)
    _facts: Mapping[str, Any] = field(default_factory=dict)

    def named(self, name: str) -> MakeNode:
        return dataclasses.replace(self, name=name)

    def cpus(self, cpus: float) -> MakeNode:
        """Allocatable CPUs (fractions become millicores)."""
        return dataclasses.replace(self, _cpu_milli=int(cpus * 1000))

    def cpu_milli(self, milli: int) -> MakeNode:
        return dataclasses.replace(self, _cpu_milli=milli)

    def memory_gib(self, gib: float) -> MakeNode:
        return dataclasses.replace(self, _memory_bytes=int(gib * GiB))

    def memory_bytes(self, size: int) -> MakeNode:
        return dataclasses.replace(self, _memory_bytes=size)

    def labels(self, labels: Mapping[str, str] | None = None, **more: str) -> MakeNode:
        """Labels added to the node's (keys with dots and slashes: pass a mapping)."""
        return dataclasses.replace(self, _labels={**self._labels, **(labels or {}), **more})

    def hostname_label(self) -> MakeNode:
        """The `kubernetes.io/hostname` label every kubelet sets."""
        return self.labels({"kubernetes.io/hostname": self.name})

    def registered(self) -> MakeNode:
        """As a kubelet registers it: a uid (`uid-<name>`, unless one is given) and
        the hostname label, both from the name it has when built."""
        return dataclasses.replace(self, _registered=True)

    def annotations(self, annotations: Mapping[str, str]) -> MakeNode:
        return dataclasses.replace(self, _annotations={**self._annotations, **annotations})

    def taints(self, *taints: Taint) -> MakeNode:
        return dataclasses.replace(self, _taints=tuple(taints))

    def cpu_flags(self, flags: Iterable[str] | None, source: FactSource = FactSource.NFD
                  ) -> MakeNode:
        """Known CPU features (upper-case CPUID names); None: unknown (no source)."""
        if flags is None:
            return dataclasses.replace(self, _flags=None, _source=FactSource.NONE)
        return dataclasses.replace(self, _flags=frozenset(flags), _source=source)

    def unschedulable(self, unschedulable: bool = True) -> MakeNode:
        return dataclasses.replace(self, _schedulable=not unschedulable)

    def uid(self, uid: str) -> MakeNode:
        return dataclasses.replace(self, _uid=uid)

    def with_facts(self, **fields: Any) -> MakeNode:
        """Other NodeFacts fields (`cgroup_cpu_quota`, `threads_per_core`...):
        `facts()` only (the machine's or the probe's, not a Node field)."""
        return dataclasses.replace(self, _facts={**self._facts, **fields})

    # ---- the result -------------------------------------------------------------

    def _all_labels(self) -> dict[str, str]:
        hostname = {"kubernetes.io/hostname": self.name} if self._registered else {}
        return {**hostname, **self._labels}

    def facts(self) -> NodeFacts:
        return NodeFacts(
            name=self.name,
            allocatable_cpu_milli=self._cpu_milli,
            allocatable_memory_bytes=self._memory_bytes,
            labels=self._all_labels(),
            taints=self._taints,
            cpu_flags=self._flags,
            source=self._source,
            schedulable=self._schedulable,
            **self._facts,
        )

    def manifest(self) -> Manifest:
        """The Node object (`facts.node.from_node` reads it back)."""
        if self._flags is not None and self._source is not FactSource.NFD:
            raise ValueError("a Node manifest spells CPU features as NFD labels only")
        labels = self._all_labels()
        for flag in sorted(self._flags or ()):
            labels.setdefault(f"{NFD_CPU}cpuid.{flag}", "true")
        meta: Manifest = {"name": self.name}
        uid = self._uid or (f"uid-{self.name}" if self._registered else None)
        if uid is not None:
            meta["uid"] = uid
        meta["labels"] = labels
        if self._annotations:
            meta["annotations"] = dict(self._annotations)
        spec: Manifest = {}
        if self._taints:
            spec["taints"] = [
                {k: v for k, v in dataclasses.asdict(t).items() if v is not None}
                for t in self._taints
            ]
        if not self._schedulable:
            spec["unschedulable"] = True
        body: Manifest = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        if spec:
            body["spec"] = spec
        body["status"] = {"allocatable": {"cpu": cpu_quantity(self._cpu_milli),
                                          "memory": memory_quantity(self._memory_bytes)}}
        return body


def by_kind_name(objects: Iterable[Manifest]) -> dict[str, Manifest]:
    """Rendered objects by `Kind/name`."""
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def container_status(name: str, *, waiting: tuple[str, str] | None = None,
                     terminated: tuple[int, str, str] | None = None,
                     last: tuple[int, str, str] | None = None, restarts: int = 0,
                     image: str = "img:1") -> Manifest:
    """One entry of a pod's `status.containerStatuses` as the kubelet writes it:
    `waiting` (reason, message); `terminated` now and `last` (lastState) as
    (exitCode, reason, message); no state given: running."""
    def ended(t: tuple[int, str, str]) -> Manifest:
        return {"exitCode": t[0], "reason": t[1], "message": t[2]}

    state: Manifest = {"running": {"startedAt": "2026-12-01T00:00:00Z"}}
    if waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    elif terminated is not None:
        state = {"terminated": ended(terminated)}
    body: Manifest = {"name": name, "image": image, "ready": False, "restartCount": restarts,
                      "state": state}
    if last is not None:
        body["lastState"] = {"terminated": ended(last)}
    return body


def with_container_statuses(pod: Manifest, containers: Iterable[Manifest] = (),
                            inits: Iterable[Manifest] = ()) -> Manifest:
    """A stored pod (not Ready) whose kubelet reports these container statuses."""
    body = {**pod, "status": {**pod.get("status", {}), "containerStatuses": list(containers),
                              "initContainerStatuses": list(inits)}}
    body["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return body
