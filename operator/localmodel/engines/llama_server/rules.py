"""llama-server's own rules (rules/table.py runs them at their `Stage`): its
serving decision (the total context split into explicit slots) and the
switches of its own. The table names this engine as theirs."""

from __future__ import annotations

from localmodel.engines.llama_server.tuning import LlamaServerTuning
from localmodel.rules.model import Context, Rule, Stage, TuningDraft
from localmodel.rules.steps import serve, spell

_TUNING = LlamaServerTuning()


def _serving(ctx: Context, s: TuningDraft) -> str | None:
    return serve(ctx, s, _TUNING.serving)


def _metrics(ctx: Context, s: TuningDraft) -> str | None:
    return spell(s, _TUNING.metrics_on())


def _no_web_ui(ctx: Context, s: TuningDraft) -> str | None:
    return spell(s, _TUNING.web_ui_off())


def _private_slots(ctx: Context, s: TuningDraft) -> str | None:
    if ctx.spec.gateway.enabled:
        return None
    return spell(s, _TUNING.slots_endpoint_off())


RULES: dict[Stage, tuple[Rule, ...]] = {
    Stage.SERVING: (
        Rule(
            id="llama-server-context-per-slot",
            title="Explicit slots, each with the full context",
            effect="-c context x slots, -np slots; -m the GGUF on the weights volume, --alias "
            "model; engine bound to loopback behind the gateway (--host, --port)",
            reason="-c is the total context, split evenly across -np slots; without -np recent "
            "builds default to 4 slots sharing one cache",
            source="llama.cpp#16736; llama.cpp tools/server/README.md (-c, -np)",
            apply=_serving,
        ),
    ),
    Stage.SWITCHES: (
        Rule(
            id="llama-server-metrics",
            title="Engine metrics on",
            effect="--metrics",
            reason="llama-server's Prometheus endpoint is off by default; its decode and queue "
            "counters explain a slow model",
            source="llama.cpp tools/server/README.md (--metrics)",
            apply=_metrics,
        ),
        Rule(
            id="llama-server-no-webui",
            title="No web UI",
            effect="--no-webui",
            reason="callers use the API through the gateway; the UI is code nobody in the pod "
            "needs",
            source="llama.cpp tools/server/README.md (--no-webui)",
            apply=_no_web_ui,
        ),
        Rule(
            id="llama-server-private-slots",
            title="No /slots endpoint when the engine is exposed",
            effect="--no-slots",
            reason="/slots shows every slot's prompt text; behind the gateway the engine listens "
            "on loopback only, without it the Service reaches the engine directly",
            source="llama.cpp tools/server/README.md (--slots, --no-slots)",
            apply=_private_slots,
            spec_condition="gateway.enabled: false",
        ),
    ),
}
