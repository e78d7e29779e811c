"""llama-server's adapter, doctor part (engines/doctor.py): its props (which
report no thread count), its command line and environment, its loading
status (tools/server/README.md)."""

from __future__ import annotations

import re
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localmodel.engines.doctor import (
    EngineProcess,
    EngineReading,
    GetJson,
    LoadedModel,
    flag_value,
)
from localmodel.engines.llama_server import (
    CONTEXT_FLAGS,
    HEALTH_PATH,
    LOADING_STATUS,
    MODEL_FLAGS,
    NAME,
    PROPS_PATH,
    THREADS_ENV,
    THREADS_FLAGS,
)
from localmodel.versions import Version

_IMAGE = re.compile(r"llama[.-]?cpp|llama-server", re.IGNORECASE)


def threads_from_command_line(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """llama-server's ``-t/--threads N`` (or ``--threads=N``), else ``LLAMA_ARG_THREADS``
    (the flag wins: llama.cpp applies the environment first; docs/engine-facts.md,
    "The child inherits the environment")."""
    found: int | None = None
    args = list(argv)
    for index, arg in enumerate(args):
        value: str | None = None
        if arg in THREADS_FLAGS and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(f"{THREADS_FLAGS[-1]}="):  # --threads=N
            value = arg.split("=", 1)[1]
        if value is not None and value.lstrip("-").isdigit():
            found = int(value)
    if found is None and env.get(THREADS_ENV, "").isdigit():
        found = int(env[THREADS_ENV])
    return found if found is None or found > 0 else None


def _loading(get: GetJson) -> bool:
    """Whether llama-server's health path says it is loading its model (an
    engine that is not there does not answer at all)."""
    try:
        get(HEALTH_PATH, None)
    except urllib.error.HTTPError as e:
        return e.code == LOADING_STATUS
    except (OSError, ValueError):
        return False
    return False


class LlamaServerDoctor:
    """llama-server: what doctor reads from a running engine."""

    title = NAME
    processes = 1
    loading_sign = f"it answers {LOADING_STATUS} until the model is loaded"
    threads_default = "llama-server uses the host's cores, ignoring quota and cpuset"
    amx_fixed_in: Version | None = None

    def runs_image(self, image: str) -> bool:
        return _IMAGE.search(image) is not None

    def read(self, get: GetJson, process: EngineProcess | None) -> EngineReading:
        try:
            props = get(PROPS_PATH, None)
        except urllib.error.HTTPError as e:
            if e.code == LOADING_STATUS and _loading(get):
                return self._reading({}, process, loading=True)
            raise
        if not isinstance(props, dict):
            raise ValueError(f"{PROPS_PATH} is not a JSON object")
        return self._reading(props, process)

    def _reading(
        self, props: Mapping[str, Any], process: EngineProcess | None, loading: bool = False
    ) -> EngineReading:
        settings = props.get("default_generation_settings") or {}
        slots = props.get("total_slots")
        context = settings.get("n_ctx") if isinstance(settings, dict) else None
        model_path = str(props.get("model_path") or props.get("model_alias") or "the model")
        threads = None
        source = ""
        if process is not None:
            threads = threads_from_command_line(process.argv, process.env)
            if threads is not None:
                source = f"command line of pid {process.pid}"
        return EngineReading(
            version=str(props.get("build_info") or "") or None,
            models=(LoadedModel(name=Path(model_path).name, context=context),),
            slots=slots if isinstance(slots, int) else None,
            context_per_slot=context if isinstance(context, int) else None,
            threads=threads,
            threads_source=source or "no local process found",
            loading=loading,
        )

    def pod_threads(self, argv: Sequence[str], env: Mapping[str, str]) -> int | None:
        return threads_from_command_line(argv, env)

    def pod_context(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        return flag_value(argv, *CONTEXT_FLAGS)

    def pod_model(self, argv: Sequence[str]) -> str | None:
        return flag_value(argv, *MODEL_FLAGS)

    def pod_threads_fix(self, want: int) -> str:
        return f"start llama-server with --threads {want}"

    def local_threads_fix(self, want: int) -> str:
        return f"start it with --threads {want} (-t {want})"

    def unset_threads(self, default: int, want: int) -> tuple[str, str] | None:
        return (
            f"llama-server runs without --threads: it uses its default ({default}, the "
            "host's cores; cgroup quota and cpuset ignored)",
            f"start it with --threads {want}",
        )

    def amx_guarded(self, version: Version | None, env: Mapping[str, str], commands: str) -> bool:
        return True

    def amx_workaround(self, version: Version | None) -> str:
        return ""
