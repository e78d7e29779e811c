"""Rule steps more than one engine's own rules take (engines/<name>/rules.py):
writing a spelled decision into the draft, the serving decision, the note a
guard adds when it takes the safe side, and the CPU features that mean AMX.
They sit with the rules' shapes, below the adapters, so an engine's rules
take them without importing the rules table (which asks the adapters)."""

from __future__ import annotations

from collections.abc import Callable

from localmodel.rules.model import Context, Serving, Spelled, TuningDraft

# The CPU features of Intel AMX (NFD and probe labels): the AMX guards' condition
# and doctor's.
AMX_FLAGS = frozenset({"AMXTILE", "AMXBF16", "AMXINT8", "AMXFP16"})


def spell(s: TuningDraft, spelled: Spelled) -> str:
    """Write a decision as the engine spells it into the draft; its words."""
    s.args.update(spelled.args)
    s.env.update(spelled.env)
    s.modelfile.update(spelled.modelfile)
    return spelled.how


def spell_if(s: TuningDraft, spelled: Spelled | None) -> str | None:
    """`spell`, when the engine has the decision to spell (None: it has not)."""
    return spell(s, spelled) if spelled is not None else None


def serve(ctx: Context, s: TuningDraft, spelling: Callable[[Serving], Spelled]) -> str:
    """The serving decision (one model, its slots and context per slot, bound
    behind the gateway), spelled by the engine's `spelling`; it also fixes the
    draft's flash attention and KV cache type from the spec."""
    spec = ctx.spec
    serving = Serving(
        model=spec.model,
        weights_file=spec.gguf.file_name() if spec.gguf is not None else None,
        context=spec.context,
        slots=spec.slots,
        keep_alive=spec.keep_alive,
        behind_gateway=spec.gateway.enabled,
    )
    how = spell(s, spelling(serving))
    s.flash_attention = spec.flash_attention
    s.kv_cache = spec.kv_cache
    return how


def safe_side_note(ctx: Context) -> str:
    """What a guard did not know and so took the safe side on ("" when it knew all)."""
    notes = []
    if ctx.node.cpu_flags is None:
        notes.append("CPU features unknown on this node (no NFD or probe labels)")
    if ctx.version is None:
        notes.append("engine version unknown")
    return f" ({'; '.join(notes)}: taking the safe side)" if notes else ""
