"""An engine adapter's doctor part (engines/adapter.py): what `localmodel
doctor` reads from a running engine and how it recognises one.

Doctor's checks and their findings are doctor's (operator/localmodel/doctor/);
an engine's `EngineDoctor` says how that engine is recognised in a pod, read
over its HTTP API and from its process, and how advice is worded for it. It
works on plain values so that the engines import no doctor module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localmodel.versions import Version

# GET (body None) or POST (a JSON body) one path of the engine's HTTP API: its
# JSON answer. Raises OSError (urllib.error.HTTPError for an HTTP status) or
# ValueError (not JSON).
GetJson = Callable[[str, Any], Any]


@dataclass(frozen=True)
class LoadedModel:
    """One model an engine says it has loaded: its name, size and context, when said."""

    name: str
    size_bytes: int | None = None
    context: int | None = None


@dataclass(frozen=True)
class EngineProcess:
    """The process listening on the engine's port, when it runs on this machine."""

    pid: int
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineReading:
    """What an engine's HTTP API and process told doctor."""

    version: str | None = None
    models: tuple[LoadedModel, ...] = ()
    slots: int | None = None
    context_per_slot: int | None = None
    threads: int | None = None
    threads_source: str = ""  # where ``threads`` came from, for the message
    loading: bool = False  # it answered, but is still loading its model


def flag_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the first of `flags` on a command line (``-c N`` or ``-c=N``)."""
    for index, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and index + 1 < len(argv):
                return argv[index + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


class EngineDoctor(Protocol):
    """What doctor reads from a running engine."""

    title: str  # its name as prose writes it ("Ollama")
    # The processes its container runs of its own (cAdvisor's container_processes).
    processes: int
    # How it shows that it is still loading its model, for the message.
    loading_sign: str
    # What it does when no thread count is set, for a pod's finding.
    threads_default: str
    # The first version without the AMX crash; None: no build of it crashes.
    amx_fixed_in: Version | None

    def runs_image(self, image: str) -> bool:
        """Whether a container image runs this engine (Ollama's or llama.cpp's images)."""
        ...

    def read(self, get: GetJson, process: EngineProcess | None) -> EngineReading:
        """Ask the engine what it holds and how it runs. Raises OSError or
        ValueError when what answers is not this engine (or not up)."""
        ...

    def pod_threads(self, argv: Sequence[str], env: Mapping[str, str]) -> int | None:
        """The thread count a pod's engine container sets itself (its command line)."""
        ...

    def pod_context(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """A pod's context as its engine container sets it (text, as written)."""
        ...

    def pod_model(self, argv: Sequence[str]) -> str | None:
        """The model a pod's engine container names on its command line."""
        ...

    def pod_threads_fix(self, want: int) -> str:
        """How to give a pod's engine `want` threads (the fix)."""
        ...

    def local_threads_fix(self, want: int) -> str:
        """How to run a local engine at `want` threads (the fix)."""
        ...

    def unset_threads(self, default: int, want: int) -> tuple[str, str] | None:
        """A local engine process without a thread count: what it does (with a
        default of `default`) and the fix; None when it cannot be seen."""
        ...

    def amx_guarded(self, version: Version | None, env: Mapping[str, str], commands: str) -> bool:
        """Whether a pod's settings (its engine environment, every container's
        command line) carry the AMX workaround."""
        ...

    def amx_workaround(self, version: Version | None) -> str:
        """What keeps an AMX host safe on this version without the fix."""
        ...
