"""llama-server's adapter, tuning part (engines/tuning.py): the rules'
decisions as llama-server's flags (llama.cpp common/arg.cpp,
tools/server/README.md); the rules set none of its variables."""

from __future__ import annotations

from collections.abc import Mapping

from localmodel.engines.llama_server import MODELS_DIR, PORT
from localmodel.rules.model import Serving, Spelled

# -fa takes a value; a bare `-fa` would swallow the next argument
# (llama.cpp common/arg.cpp). Keyed by the API's FlashAttention values.
_FA_FLAG = {"auto": "auto", "enabled": "on", "disabled": "off"}


class LlamaServerTuning:
    """llama-server: how the rules' decisions are spelled for it."""

    models_volume = MODELS_DIR
    flash_attention_on = "-fa on"

    def threads(self, n: int) -> Spelled:
        # -tb defaults to -t, but say both: prefill uses -tb (llama.cpp common/arg.cpp).
        return Spelled(f"-t {n} -tb {n}", args={"-t": str(n), "-tb": str(n)})

    def serving(self, serving: Serving) -> Spelled:
        s, bind = serving, serving.bind
        assert s.weights_file is not None  # the API requires spec.gguf for llama-server
        total = s.context * s.slots
        return Spelled(
            f"-c {total} -np {s.slots}: {s.slots} slot(s) of {s.context} tokens; "
            f"engine on {bind}:{PORT}",
            args={
                "-m": f"{MODELS_DIR}/{s.weights_file}",
                "--alias": s.model,
                "--host": bind,
                "--port": str(PORT),
                "-c": str(total),
                "-np": str(s.slots),
            },
        )

    def metrics_on(self) -> Spelled:
        return Spelled("--metrics: Prometheus metrics at /metrics", args={"--metrics": ""})

    def prompt_cache(self, mib: int) -> Spelled:
        # In MiB; 0 keeps none, -1 no limit, unset 8192 (llama.cpp common/arg.cpp).
        return Spelled(f"--cache-ram {mib}", args={"--cache-ram": str(mib)})

    def context_checkpoints(self, n: int) -> Spelled:
        # Per slot; unset 32 (llama.cpp common/common.h n_ctx_checkpoints).
        return Spelled(f"--ctx-checkpoints {n}", args={"--ctx-checkpoints": str(n)})

    def web_ui_off(self) -> Spelled:
        return Spelled("--no-webui", args={"--no-webui": ""})

    def slots_endpoint_off(self) -> Spelled:
        return Spelled(
            "--no-slots: the engine faces the Service directly, and /slots shows prompts",
            args={"--no-slots": ""},
        )

    def command_line(
        self, args: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> tuple[str, ...]:
        flags = dict(args)
        flags["-ctk"] = flags["-ctv"] = kv_cache
        flags["-fa"] = _FA_FLAG[flash_attention]
        out: list[str] = []
        for flag, value in flags.items():
            out += [flag, value] if value else [flag]
        return tuple(out)

    def environment(
        self, env: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> dict[str, str]:
        return dict(sorted(env.items()))
