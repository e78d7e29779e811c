"""tinyserve's adapter, doctor part (localmodel.engines.doctor): its state
path (what it serves, its workers, lanes and window), its warming status. Its
settings are in its config file, not on its command line: a pod shows none."""

from __future__ import annotations

import urllib.error
from collections.abc import Mapping, Sequence

from localmodel.engines.doctor import EngineProcess, EngineReading, GetJson, LoadedModel
from localmodel.versions import Version
from tests.engines.tinyserve import CONFIG_FILE, HEALTH_PATH, NAME, STATE_PATH


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class TinyServeDoctor:
    """tinyserve: what doctor reads from a running one."""

    title = NAME
    processes = 1
    loading_sign = f"{HEALTH_PATH} answers 503 with state warming until it serves"
    threads_default = "tinyserve runs one worker unless its config file says `workers`"
    amx_fixed_in: Version | None = None

    def runs_image(self, image: str) -> bool:
        return NAME in image.lower()

    def read(self, get: GetJson, process: EngineProcess | None) -> EngineReading:
        state = get(STATE_PATH, None)
        if not isinstance(state, dict) or state.get("engine") != NAME:
            raise ValueError(f"{STATE_PATH} is not tinyserve's state")
        warming = state.get("warming") is True
        if not warming:
            try:
                get(HEALTH_PATH, None)
            except urllib.error.HTTPError as e:
                warming = e.code == 503
        window = _int(state.get("window"))
        return EngineReading(
            version=str(state.get("version") or "") or None,
            models=(LoadedModel(name=str(state.get("serving") or "?"), context=window),),
            slots=_int(state.get("lanes")),
            context_per_slot=window,
            threads=_int(state.get("workers")),
            threads_source=f"{STATE_PATH} workers",
            loading=warming,
        )

    def pod_threads(self, argv: Sequence[str], env: Mapping[str, str]) -> int | None:
        return None  # in its config file (the operator's annotation says it)

    def pod_context(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        return None

    def pod_model(self, argv: Sequence[str]) -> str | None:
        return None

    def pod_threads_fix(self, want: int) -> str:
        return f"set \"workers\": {want} in its config file ({CONFIG_FILE})"

    def local_threads_fix(self, want: int) -> str:
        return self.pod_threads_fix(want)

    def unset_threads(self, default: int, want: int) -> tuple[str, str] | None:
        return None

    def amx_guarded(self, version: Version | None, env: Mapping[str, str], commands: str) -> bool:
        return True  # no build of it has an AMX path

    def amx_workaround(self, version: Version | None) -> str:
        return ""
