"""tinyserve's adapter, tuning part (localmodel.engines.tuning): the rules'
decisions as entries of its JSON config file (server.py `Config`). It takes
no flags and reads no variables: each decision is a config key, and
`command_line` gives the entries as `key=value` words, which its pod's init
step writes into the file (pod.py)."""

from __future__ import annotations

from collections.abc import Mapping

from localmodel.rules.model import Serving, Spelled
from tests.engines.tinyserve import MODELS_DIR, PORT

# Its `fused_attention` values, keyed by the API's FlashAttention values.
_FUSED = {"auto": "auto", "enabled": "on", "disabled": "off"}


class TinyServeTuning:
    """tinyserve: how the rules' decisions are spelled for it."""

    models_volume = MODELS_DIR
    flash_attention_on = "fused_attention on"

    def threads(self, n: int) -> Spelled:
        return Spelled(f"workers {n}", args={"workers": str(n)})

    def serving(self, serving: Serving) -> Spelled:
        s = serving
        assert s.weights_file is not None  # the API requires spec.gguf for it (NEEDS_GGUF)
        listen = f"{s.bind}:{PORT}"
        return Spelled(
            f"serve_as {s.model}: {s.slots} lane(s) of a {s.context}-token window; listen {listen}",
            args={"serve_as": s.model, "weights": f"{MODELS_DIR}/{s.weights_file}",
                  "lanes": str(s.slots), "window": str(s.context), "listen": listen},
        )

    def prompt_cache(self, mib: int) -> Spelled:
        return Spelled(f"memo_mib {mib}", args={"memo_mib": str(mib)})

    def context_checkpoints(self, n: int) -> Spelled:
        # tinyserve has no sliding window, so it keeps no checkpoints to bound.
        return Spelled("no context checkpoints (no sliding window)")

    def ledger_on(self) -> Spelled:
        """Its account of each generation on the answer (`tiny_ledger`)."""
        return Spelled("ledger on: tiny_ledger on every answer", args={"ledger": "on"})

    def command_line(
        self, args: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> tuple[str, ...]:
        entries = {**args, "kv": kv_cache, "fused_attention": _FUSED[flash_attention]}
        return tuple(f"{key}={value}" for key, value in entries.items())

    def environment(
        self, env: Mapping[str, str], kv_cache: str, flash_attention: str
    ) -> dict[str, str]:
        return dict(sorted(env.items()))
