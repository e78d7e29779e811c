"""Which pods run an engine, pure: ours and any other pod whose container runs
an engine's image (each engine's adapter recognises its images and reads its
container: engines/<name>/doctor.py). Below the programs: doctor, timeline and
the kubectl plugin read pods through it, and none of them imports another."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localmodel.contract import ANNOTATION_THREADS, LABEL_NAME
from localmodel.engines.adapter import Engine
from localmodel.engines.registry import ENGINES
from localmodel.facts.quantity import parse_bytes, parse_cpu_milli
from localmodel.gateway_contract import env_name

__all__ = ["EnginePod", "engine_pods"]

_DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class EnginePod:
    """One pod holding a model's weights, as its container and annotations say."""

    namespace: str
    name: str
    node: str
    ours: bool  # rendered by the operator (localmodel.dev/name label)
    engine: str  # the engine's name (its adapter's)
    image: str
    model: str | None
    memory_bytes: int | None  # the engine container's memory limit (else request)
    cpu_milli: int | None  # the engine container's CPU limit (else request)
    threads: int | None
    threads_source: str
    context: int | None
    gateway: bool
    env: Mapping[str, str] = field(default_factory=dict)
    commands: str = ""  # every container's command and args, for the AMX guard
    container: str = ""  # the engine container's name
    local_model: str | None = None  # the LocalModel it serves (ours only)
    container_id: str = ""  # its runtime ID (status.containerStatuses), without the scheme
    # When the engine container started running, while its startup probe has
    # not passed yet (its model still loading); "" otherwise.
    loading_since: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label(self) -> str:
        return f"{self.key} ({self.model})" if self.model else self.key


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(e["name"]): str(e.get("value", ""))
        for e in container.get("env") or []
        if isinstance(e, Mapping) and "name" in e and "value" in e
    }


def _quantity(resources: Mapping[str, Any], name: str, parse: Callable[[str], int]) -> int | None:
    for section in ("limits", "requests"):
        raw = (resources.get(section) or {}).get(name)
        if raw is not None:
            try:
                return parse(str(raw))
            except ValueError:
                return None
    return None


def _is_gateway(container: Mapping[str, Any]) -> bool:
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    return "gateway" in words and any("localmodel" in str(w) for w in words)


def _engine_of(image: str) -> Engine | None:
    """The engine a container image runs, the first whose adapter knows it."""
    return next((e for e in ENGINES.values() if e.doctor.runs_image(image)), None)


def engine_pods(pods: Iterable[Mapping[str, Any]]) -> list[EnginePod]:
    """The running or scheduled pods whose containers run an engine's image."""
    found = []
    for pod in pods:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        if not spec.get("nodeName") or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in _DONE_PHASES:
            continue
        containers = list(spec.get("containers") or [])
        engines = [(c, e) for c in containers if (e := _engine_of(str(c.get("image", ""))))]
        if engines:
            found.append(_engine_pod(pod, *engines[0]))
    return found


def _engine_pod(pod: Mapping[str, Any], container: Mapping[str, Any], engine: Engine) -> EnginePod:
    """One pod, its engine running in `container`."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    env = _env(container)
    gateway = next((c for c in containers if _is_gateway(c)), None)
    gateway_env = _env(gateway) if gateway else {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    threads: int | None = None
    source = ""
    if str(annotations.get(ANNOTATION_THREADS, "")).isdigit():
        threads, source = int(annotations[ANNOTATION_THREADS]), "the operator's Modelfile"
    else:
        threads = engine.doctor.pod_threads(argv, env)
        source = "its command line" if threads is not None else ""
    context_text = (
        gateway_env.get(env_name("context")) or engine.doctor.pod_context(argv, env) or ""
    )
    model = (
        gateway_env.get(env_name("model"))
        or engine.doctor.pod_model(argv)
        or (str(labels[LABEL_NAME]) if LABEL_NAME in labels else None)
    )
    resources = container.get("resources") or {}
    return EnginePod(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "?")),
        node=str(spec.get("nodeName")),
        ours=LABEL_NAME in labels,
        engine=engine.name,
        image=str(container.get("image", "")),
        model=model or None,
        memory_bytes=_quantity(resources, "memory", parse_bytes),
        cpu_milli=_quantity(resources, "cpu", parse_cpu_milli),
        threads=threads,
        threads_source=source,
        context=int(context_text) if context_text.isdigit() else None,
        gateway=gateway is not None,
        env=env,
        commands=_commands([*containers, *(spec.get("initContainers") or [])]),
        container=str(container.get("name", "")),
        local_model=str(labels[LABEL_NAME]) if LABEL_NAME in labels else None,
        container_id=_container_id(pod, container),
        loading_since=_loading_since(pod, container),
    )


def _commands(containers: Sequence[Mapping[str, Any]]) -> str:
    """Every container's command and args, as one text (for the AMX guard)."""
    return " ".join(
        " ".join(str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])])
        for c in containers
    )


def _loading_since(pod: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    """The engine container's `state.running.startedAt` while it runs and its
    startup probe has not passed (`started: false`); "" otherwise, or when what
    the status holds is not a short string."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if not isinstance(c, Mapping) or c.get("name") != container.get("name"):
            continue
        running = (c.get("state") or {}).get("running")
        since = running.get("startedAt") if isinstance(running, Mapping) else None
        if c.get("started") is False and isinstance(since, str) and len(since) <= 40:
            return since
    return ""


def _container_id(pod: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    """The engine container's runtime ID (status.containerStatuses), without the scheme."""
    return next(
        (str(c.get("containerID", "")).split("://", 1)[-1]
         for c in (pod.get("status") or {}).get("containerStatuses") or []
         if c.get("name") == container.get("name") and c.get("containerID")), "")
