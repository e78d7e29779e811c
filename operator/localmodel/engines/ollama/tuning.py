"""Ollama's adapter, tuning part (engines/tuning.py): the rules' decisions as
Ollama reads them, from its environment (ollama envconfig/config.go) and the
Modelfile; `ollama serve` takes no flags."""

from __future__ import annotations

from collections.abc import Mapping

from localmodel.engines.ollama import (
    AMX_LIBRARY,
    AMX_VARIANT_BACK,
    CHECKPOINTS_ENV,
    CPU_RUNNERS_UNTIL,
    HOME,
    MODELS_DIR,
    PORT,
    PROMPT_CACHE_ENV,
)
from localmodel.rules.model import Serving, Spelled
from localmodel.versions import Version


def amx_workaround(version: Version | None) -> str:
    """What keeps an AMX host safe on an Ollama version without the fix, as the
    amx rules apply it (docs/engine-facts.md#amx): for the doctor's advice."""
    remove = f"delete {AMX_LIBRARY} at start"
    fa_off = "set OLLAMA_FLASH_ATTENTION=0"
    if version is not None and version >= AMX_VARIANT_BACK:
        return remove
    if version is not None and version >= CPU_RUNNERS_UNTIL:
        return fa_off
    if version is not None:
        return f"{fa_off} and OLLAMA_LLM_LIBRARY=cpu_avx2"
    return f"{fa_off} and {remove} (version unknown)"


def amx_guarded(version: Version | None, env: Mapping[str, str], library_removed: bool) -> bool:
    """Whether a pod's engine settings carry that workaround."""
    fa_off = env.get("OLLAMA_FLASH_ATTENTION") in ("0", "false")
    if version is None:
        return fa_off and library_removed
    if version >= AMX_VARIANT_BACK:
        return library_removed
    return fa_off and (version >= CPU_RUNNERS_UNTIL or env.get("OLLAMA_LLM_LIBRARY") == "cpu_avx2")


class OllamaTuning:
    """Ollama: how the rules' decisions are spelled for it."""

    models_volume = HOME
    flash_attention_on = "OLLAMA_FLASH_ATTENTION=1"

    def threads(self, n: int) -> Spelled:
        return Spelled(
            f"Modelfile PARAMETER num_thread {n}, GOMAXPROCS={n}",
            env={"GOMAXPROCS": str(n)},
            modelfile={"num_thread": str(n)},
        )

    def serving(self, serving: Serving) -> Spelled:
        s, bind = serving, serving.bind
        return Spelled(
            f"OLLAMA_MAX_LOADED_MODELS=1, OLLAMA_NUM_PARALLEL={s.slots}, "
            f"OLLAMA_CONTEXT_LENGTH={s.context}, OLLAMA_KEEP_ALIVE={s.keep_alive}, "
            f"OLLAMA_MODELS={MODELS_DIR}, engine on {bind}:{PORT}",
            env={
                "OLLAMA_HOST": f"{bind}:{PORT}",
                "OLLAMA_MODELS": MODELS_DIR,
                "OLLAMA_MAX_LOADED_MODELS": "1",
                "OLLAMA_NUM_PARALLEL": str(s.slots),
                "OLLAMA_CONTEXT_LENGTH": str(s.context),
                "OLLAMA_KEEP_ALIVE": s.keep_alive,
            },
            modelfile={"num_ctx": str(s.context)},
        )

    def micro_batch(self, n: int) -> Spelled:
        return Spelled(
            f"Modelfile PARAMETER num_batch {n} (its llama-server child's -b and -ub)",
            modelfile={"num_batch": str(n)},
        )

    def safe_cpu_runner(self, version: Version | None) -> Spelled | None:
        # Only the old per-CPU-level runners can be chosen by name; from v0.5.12
        # the variable does nothing on CPU, so it is not presented as a fix there.
        if version is not None and version >= CPU_RUNNERS_UNTIL:
            return None
        return Spelled(
            "OLLAMA_LLM_LIBRARY=cpu_avx2 (chooses the AVX2 runner before 0.5.12)",
            env={"OLLAMA_LLM_LIBRARY": "cpu_avx2"},
        )

    def prompt_cache(self, mib: int) -> Spelled:
        return Spelled(
            f"{PROMPT_CACHE_ENV}={mib} (its llama-server child inherits it)",
            env={PROMPT_CACHE_ENV: str(mib)},
        )

    def context_checkpoints(self, n: int) -> Spelled:
        return Spelled(
            f"{CHECKPOINTS_ENV}={n} (its llama-server child inherits it)",
            env={CHECKPOINTS_ENV: str(n)},
        )

    def command_line(
        self, args: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> tuple[str, ...]:
        return ()

    def environment(
        self, env: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> dict[str, str]:
        # Flash attention and the KV cache type, written in exactly one place
        # (ollama envconfig/config.go); "auto" leaves Ollama its own default.
        out = dict(env)
        if flash_attention == "enabled":
            out["OLLAMA_FLASH_ATTENTION"] = "1"
        elif flash_attention == "disabled":
            out["OLLAMA_FLASH_ATTENTION"] = "0"
        out["OLLAMA_KV_CACHE_TYPE"] = kv_cache
        return dict(sorted(out.items()))
