"""llama-server's own rules (rules/table.py runs them at their `Stage`): its
serving decision (the total context split into explicit slots) and the
switches of its own. The table names this engine as theirs."""

from __future__ import annotations

from localmodel.engines import llama_server
from localmodel.engines.llama_server.tuning import LlamaServerTuning
from localmodel.facts.quantity import format_bytes
from localmodel.podspec import (
    DEFAULT_DISK_BYTES_PER_SECOND,
    STARTUP_FLOOR_SECONDS,
    STARTUP_MULTIPLE,
    STARTUP_PERIOD_SECONDS,
    expected_load_seconds,
    startup_bound_seconds,
    startup_probe_timing,
)
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


def _startup(ctx: Context, s: TuningDraft) -> str | None:
    # Without a known shape the memory limit bounds the weights (they are all
    # read into it), as the weights-volume rule sizes the volume.
    known = ctx.shape is not None
    weights = ctx.shape.weights_bytes if ctx.shape is not None else s.memory_bytes
    expected = expected_load_seconds(weights, llama_server.NAME)
    s.startup_seconds = startup_bound_seconds(expected)
    probe = startup_probe_timing(s.startup_seconds)
    rate = DEFAULT_DISK_BYTES_PER_SECOND / 10**6
    floor = " (the floor)" if s.startup_seconds == STARTUP_FLOOR_SECONDS else ""
    return (
        f"startup probe {probe['failureThreshold']} x {probe['periodSeconds']} s = "
        f"{s.startup_seconds} s{floor}: {STARTUP_MULTIPLE} x the expected load of "
        f"{expected:.0f} s ({'weights' if known else 'weights at most the memory limit'} "
        f"{format_bytes(weights)} read at {rate:g} MB/s, plus "
        f"{llama_server.LOAD_FIXED_SECONDS:g} s and {llama_server.LOAD_SECONDS_PER_GIB:g} s "
        "per GiB of its own), at least the floor"
    )


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
        Rule(
            id="llama-server-startup-from-load-time",
            title="The startup probe allows a generous multiple of the expected load",
            effect=f"startup probe (/health every {STARTUP_PERIOD_SECONDS} s) allows "
            f"max({STARTUP_MULTIPLE} x expected load, {STARTUP_FLOOR_SECONDS} s); expected load = "
            "fixed cost + cost per GiB + weights / disk speed "
            f"({DEFAULT_DISK_BYTES_PER_SECOND // 10**6} MB/s unless known)",
            reason="/health answers 503 until the whole GGUF is read and the model loaded; "
            "a load the probe cuts short is killed and starts again from zero, forever; the "
            "load reads every byte of the file from the volume (cold, minutes at network-volume "
            "speeds for a large model)",
            source="docs/engine-facts.md#a-load-reads-the-whole-file; "
            "docs/benchmarks.md#start-time-at-real-sizes-benchmarksstartpy; "
            "llama.cpp src/llama-model-loader.cpp (init_mappings: prefetch); "
            "llama.cpp src/llama-mmap.cpp (MAP_POPULATE); "
            "llama.cpp tools/server/server.cpp (listens, then loads)",
            apply=_startup,
        ),
    ),
}
