"""tinyserve's own rules (localmodel.rules.table runs them at their `Stage`):
its serving decision, and its ledger (the account of each generation the
gateway's ledger, metrics and speed read: off by default in tinyserve)."""

from __future__ import annotations

from localmodel.rules.model import Context, Rule, Stage, TuningDraft
from localmodel.rules.steps import serve, spell
from tests.engines.tinyserve.tuning import TinyServeTuning

_TUNING = TinyServeTuning()


def _serving(ctx: Context, s: TuningDraft) -> str | None:
    return serve(ctx, s, _TUNING.serving)


def _ledger(ctx: Context, s: TuningDraft) -> str | None:
    return spell(s, _TUNING.ledger_on())


RULES: dict[Stage, tuple[Rule, ...]] = {
    Stage.SERVING: (
        Rule(
            id="tinyserve-lanes",
            title="One model in explicit lanes, each with the full window",
            effect="serve_as model, lanes = slots, window = context, weights the GGUF on the "
            "weights volume, listen on loopback behind the gateway",
            reason="tinyserve splits nothing: each lane gets its own window of `window` tokens",
            source="tests/engines/tinyserve/server.py (Config)",
            apply=_serving,
        ),
    ),
    Stage.SWITCHES: (
        Rule(
            id="tinyserve-ledger",
            title="Its account of each generation on",
            effect="ledger on",
            reason="without it tinyserve's answers say nothing of their tokens and times: the "
            "gateway's ledger, metrics and speed would be empty",
            source="tests/engines/tinyserve/server.py (tiny_ledger)",
            apply=_ledger,
        ),
    ),
}
