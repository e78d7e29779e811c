"""Ollama's adapter, doctor part (engines/doctor.py): its version, loaded
models and Modelfiles (ollama docs/api.md), its process's environment, and
its AMX crash."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from localmodel.engines.doctor import (
    EngineProcess,
    EngineReading,
    GetJson,
    LoadedModel,
    int_env,
)
from localmodel.engines.ollama import (
    AMX_FIXED_IN,
    AMX_LIBRARY,
    NAME,
    PS_PATH,
    SHOW_PATH,
    VERSION_PATH,
)
from localmodel.engines.ollama.tuning import amx_guarded, amx_workaround
from localmodel.versions import Version


def modelfile_threads(parameters: str) -> int | None:
    match = re.search(r"^\s*num_thread\s+(\d+)\s*$", parameters, re.MULTILINE)
    return int(match.group(1)) if match else None


class OllamaDoctor:
    """Ollama: what doctor reads from a running engine."""

    title = "Ollama"
    # `ollama serve` starts one runner for the model it serves.
    processes = 2
    loading_sign = "it loads a model when first asked"
    threads_default = "Ollama uses cgroup v2 cpu.max when set, else the host's cores"
    amx_fixed_in: Version | None = AMX_FIXED_IN

    def runs_image(self, image: str) -> bool:
        return NAME in image.lower()

    def read(self, get: GetJson, process: EngineProcess | None) -> EngineReading:
        answer = get(VERSION_PATH, None)
        if not isinstance(answer, dict) or "version" not in answer:
            raise ValueError(f"{VERSION_PATH} gave no version")
        models = self._loaded(get)
        threads: int | None = None
        source = ""
        for model in models:
            try:
                show = get(SHOW_PATH, {"model": model.name})
            except (OSError, ValueError):
                continue
            found = modelfile_threads(str(show.get("parameters") or ""))
            if found is not None:
                threads, source = found, f"Modelfile PARAMETER num_thread of {model.name}"
                break
        env = process.env if process else {}
        return EngineReading(
            version=str(answer["version"]),
            models=models,
            slots=int_env(env, "OLLAMA_NUM_PARALLEL"),
            context_per_slot=int_env(env, "OLLAMA_CONTEXT_LENGTH"),
            threads=threads,
            threads_source=source,
        )

    def _loaded(self, get: GetJson) -> tuple[LoadedModel, ...]:
        try:
            ps = get(PS_PATH, None)
        except (OSError, ValueError):
            ps = {}
        return tuple(
            LoadedModel(
                name=str(entry.get("name") or entry.get("model")),
                size_bytes=entry.get("size"),
                context=entry.get("context_length"),
            )
            for entry in (ps or {}).get("models") or []
        )

    def pod_threads(self, argv: Sequence[str], env: Mapping[str, str]) -> int | None:
        return None  # its threads are in the Modelfile, not in the pod

    def pod_context(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        return env.get("OLLAMA_CONTEXT_LENGTH")

    def pod_model(self, argv: Sequence[str]) -> str | None:
        return None

    def pod_threads_fix(self, want: int) -> str:
        return f"set num_thread {want} (Modelfile PARAMETER or options.num_thread)"

    def local_threads_fix(self, want: int) -> str:
        return f"set PARAMETER num_thread {want} in the Modelfile (or options.num_thread {want})"

    def unset_threads(self, default: int, want: int) -> tuple[str, str] | None:
        return None

    def amx_guarded(self, version: Version | None, env: Mapping[str, str], commands: str) -> bool:
        return amx_guarded(version, env, AMX_LIBRARY in commands)

    def amx_workaround(self, version: Version | None) -> str:
        return amx_workaround(version)
