"""Where the time went, in the field's debugging order. Pure.

The field report's lesson was to look at the queue before the model: one
question took 223 minutes, mostly behind abandoned background work and two
compactions re-read at prefill speed, and only then the model's own speed. So
the causes come in that order:

1. models sharing the node (from the cluster, as `doctor` reads it);
2. waking: time the router held requests while the model woke (spec.idle),
   before they reached the gateway's queue (`wake_wait_s`, signed by the
   router); requests whose hold expired reach no ledger, so the model's
   status.idle.lastWake.expired is a footnote;
3. queueing, attributed to the callers and priorities waited behind;
4. abandoned work: slot time of requests whose caller left, before it left
   (work thrown away) and after (cancellation latency: near zero behind the
   gateway, minutes without it);
5. re-reads per session (prefill of tokens a session had already read once);
6. prefill; 7. decode.

For foreground work the parts add up to its wall time, the wake wait
included: waking + queueing + re-reading + the rest of prefill + decode +
other (the residue: the body's arrival, tokenizing, the slot's setup, the
answer's way back) = wake_wait_s + duration_s. Then the slowest foreground
requests, each with its own breakdown.

Input: ledger entries as GET /ledger serves them
(`localmodel.gateway_contract.LedgerEntry.as_json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localmodel.engine_pods import EnginePod

GONE_OUTCOMES = ("cancelled_disconnect",)  # the caller left before its answer
SLOWEST = 5
# A request's wall time and its parts, in the causes' order (`parts`).
PARTS = ("wall", "wake", "queue", "reread", "prefill", "decode", "other")

Entry = Mapping[str, Any]


def _num(entry: Entry, key: str) -> float | None:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _sum(entries: Sequence[Entry], key: str) -> float:
    return sum(_num(e, key) or 0.0 for e in entries)


def _unknown(entries: Sequence[Entry], key: str) -> int:
    return sum(1 for e in entries if _num(e, key) is None)


def _r(value: float) -> float:
    return round(value, 3)


@dataclass(frozen=True)
class Sharing:
    """Models sharing the nodes of the model's pods (None: not read, e.g.
    with --gateway-url)."""

    models: Sequence[str] | None


def model_pods(
    pods: Sequence[Mapping[str, Any]], namespace: str, name: str
) -> tuple[list[str], Sharing]:
    """The names of LocalModel namespace/name's scheduled pods, and every other
    pod holding a model (ours or not, as `doctor` finds them) on their nodes."""
    from localmodel.engine_pods import engine_pods

    found = engine_pods(pods)
    ours = _ours(found, namespace, name)
    nodes = {p.node for p in ours}
    keys = {p.key for p in ours}
    others = [
        f"{p.label} ({p.engine}) on node {p.node}"
        for p in found
        if p.node in nodes and p.key not in keys
    ]
    return [p.name for p in ours], Sharing(others)


def gatewayless(pods: Sequence[Mapping[str, Any]], namespace: str, name: str) -> list[str]:
    """The names of LocalModel namespace/name's scheduled pods that run without
    the gateway (spec.gateway.enabled: false): they keep no ledger."""
    from localmodel.engine_pods import engine_pods

    return [p.name for p in _ours(engine_pods(pods), namespace, name) if not p.gateway]


def _ours(found: Sequence[EnginePod], namespace: str, name: str) -> list[EnginePod]:
    return [p for p in found if p.namespace == namespace and p.local_model == name]


def parts(entry: Entry) -> dict[str, float]:
    """One request's wall time in parts: wake (held at the router while the
    model woke), queue, reread, prefill (the rest of it), decode, other (the
    residue). They add up to its wall time: the wake wait plus its duration
    (the wait comes before the gateway's `arrival`, so it is not in
    `duration_s`)."""
    duration = _num(entry, "duration_s") or 0.0
    wake = max(0.0, _num(entry, "wake_wait_s") or 0.0)
    queue = _num(entry, "queue_wait_s") or 0.0
    prefill_all = _num(entry, "prefill_s") or 0.0
    reread = min(_num(entry, "reread_s") or 0.0, prefill_all)
    decode = _num(entry, "decode_s") or 0.0
    other = duration - queue - prefill_all - decode
    return {
        "wall": wake + duration,
        "wake": wake,
        "queue": queue,
        "reread": reread,
        "prefill": prefill_all - reread,
        "decode": decode,
        "other": other,
    }


def _behind(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    owed: dict[tuple[str, str], float] = {}
    for entry in entries:
        for b in entry.get("waited_behind") or []:
            if not isinstance(b, Mapping):
                continue
            key = (str(b.get("caller")), str(b.get("priority")))
            owed[key] = owed.get(key, 0.0) + float(b.get("seconds") or 0.0)
    ranked = sorted(owed.items(), key=lambda item: (-item[1], item[0]))
    return [{"caller": c, "priority": p, "seconds": _r(s)} for (c, p), s in ranked]


def _abandoned(entries: Sequence[Entry]) -> dict[str, Any]:
    gone = [e for e in entries if e.get("outcome") in GONE_OUTCOMES]
    before = after = 0.0
    by_caller: dict[str, list[float]] = {}
    for e in gone:
        slot = _num(e, "slot_s") or 0.0
        held_after = _num(e, "abandoned_s") or 0.0
        held_before = max(0.0, slot - held_after)
        before += held_before
        after += held_after
        counts = by_caller.setdefault(str(e.get("caller")), [0, 0.0, 0.0])
        counts[0] += 1
        counts[1] += held_before
        counts[2] += held_after
    return {
        "requests": len(gone),
        "held_before_gone_s": _r(before),
        "held_after_gone_s": _r(after),
        "callers": [
            {
                "caller": c,
                "requests": int(n),
                "held_before_gone_s": _r(b),
                "held_after_gone_s": _r(a),
            }
            for c, (n, b, a) in sorted(by_caller.items(), key=lambda i: -i[1][1])
        ],
    }


def _rereads(entries: Sequence[Entry]) -> dict[str, Any]:
    rewrites = [e for e in entries if e.get("rewrite") is True]
    sessions: dict[tuple[str, str], list[Any]] = {}
    for e in rewrites:
        key = (str(e.get("caller")), str(e.get("session")))
        item = sessions.setdefault(key, [0, 0.0, 0, 0])
        item[0] += 1
        seconds = _num(e, "reread_s")
        if seconds is None:
            item[3] += 1
        else:
            item[1] += seconds
        item[2] += int(_num(e, "reread_tokens") or 0)
    return {
        "rewrites": len(rewrites),
        "seconds": _r(_sum(rewrites, "reread_s")),
        "unknown": _unknown(rewrites, "reread_s"),
        "sessions": [
            {
                "caller": c,
                "session": s,
                "rewrites": n,
                "seconds": _r(sec),
                "tokens": tok,
                "unknown": unk,
            }
            for (c, s), (n, sec, tok, unk) in sorted(sessions.items(), key=lambda i: -i[1][1])
        ],
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _waking(entries: Sequence[Entry], expired: int | None) -> dict[str, Any]:
    waits = [w for w in (_num(e, "wake_wait_s") for e in entries) if w is not None and w > 0]
    return {
        "requests": len(waits),
        "seconds": _r(sum(waits)),
        "median_s": _r(_median(waits)) if waits else None,
        "longest_s": _r(max(waits)) if waits else None,
        "expired_at_router": expired,
    }


def _breakdown(entry: Entry) -> dict[str, Any]:
    p = parts(entry)
    return {
        "request_id": entry.get("request_id"),
        "caller": entry.get("caller"),
        "session": entry.get("session"),
        "outcome": entry.get("outcome"),
        "arrival": entry.get("arrival"),
        "wall_s": _r(p["wall"]),
        "wake_s": _r(p["wake"]),
        "queue_s": _r(p["queue"]),
        "waited_behind": list(entry.get("waited_behind") or []),
        "reread_s": _r(p["reread"]),
        "prefill_s": _r(p["prefill"]),
        "decode_s": _r(p["decode"]),
        "other_s": _r(p["other"]),
    }


def timeline(
    entries: Sequence[Entry],
    sharing: Sharing,
    slowest: int = SLOWEST,
    expired: int | None = None,
) -> dict[str, Any]:
    """The causes in the field's order, as data (`-o json`). `expired`: held
    requests whose hold ran out before the model woke (the model's
    status.idle.lastWake.expired; None: not read or no spec.idle)."""
    local = [e for e in entries if e.get("served_by", "local") == "local"]
    foreground = [e for e in entries if e.get("priority") == "foreground"]
    reread_all = _sum(local, "reread_s")
    prefill_all = _sum(local, "prefill_s")
    fg_parts = [parts(e) for e in foreground]
    wall = {k: _r(sum(p[k] for p in fg_parts)) for k in PARTS}
    ranked = sorted(foreground, key=lambda e: -parts(e)["wall"])
    return {
        "requests": len(entries),
        "foreground": len(foreground),
        "background": sum(1 for e in entries if e.get("priority") == "background"),
        "sharing": None if sharing.models is None else list(sharing.models),
        "waking": _waking(entries, expired),
        "queueing": {
            "seconds": _r(_sum(entries, "queue_wait_s")),
            "requests_waited": sum(1 for e in entries if (_num(e, "queue_wait_s") or 0) > 0),
            "behind": _behind(entries),
        },
        "abandoned": _abandoned(entries),
        "rereads": _rereads(entries),
        "prefill": {
            "seconds": _r(prefill_all - reread_all),
            "evaluated_tokens": int(_sum(local, "evaluated_tokens")),
            "cached_tokens": int(_sum(local, "cached_tokens")),
            "unknown": _unknown(local, "prefill_s"),
            # Timed by the engine, but without saying what it reused.
            "cache_unknown": _unknown(
                [e for e in local if _num(e, "prefill_s") is not None], "cached_tokens"
            ),
        },
        "decode": {
            "seconds": _r(_sum(local, "decode_s")),
            "tokens": int(_sum(local, "generated_tokens")),
            "unknown": _unknown(local, "decode_s"),
        },
        "foreground_wall": wall,
        "slowest": [_breakdown(e) for e in ranked[:slowest]],
    }


# ---- plain words ------------------------------------------------------------------


def _s(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _behind_words(behind: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(
        f"{b.get('caller')} ({b.get('priority')}) {_s(float(b.get('seconds') or 0))}"
        for b in behind
    )


def render_table(doc: Mapping[str, Any], title: str, model: str | None = None) -> str:
    """The same numbers as `timeline`, in words a person reads at a glance.
    `model`: the LocalModel's name as the waking line says it (e.g. ai/qwen3)."""
    out = [
        f"Where the time went: {title}: {_plural(doc['requests'], 'request')} "
        f"({doc['foreground']} foreground, {doc['background']} background)",
        "",
        _sharing_line(doc["sharing"]),
        *_waking_lines(doc["waking"], model or "the model"),
        *_queueing_lines(doc["queueing"]),
        *_abandoned_lines(doc["abandoned"]),
        *_reread_lines(doc["rereads"]),
        *_prefill_decode_lines(doc["prefill"], doc["decode"]),
        *_wall_lines(doc),
        *_slowest_lines(doc["slowest"]),
    ]
    return "\n".join(out) + "\n"


def _sharing_line(sharing: Sequence[str] | None) -> str:
    if sharing is None:
        return "1. Models sharing the node: not read (one gateway by URL, no cluster)"
    if not sharing:
        return "1. Models sharing the node: none; this model has its node(s) to itself"
    return f"1. Models sharing the node: {'; '.join(sharing)}: they contend for its cores"


def _waking_lines(w: Mapping[str, Any], model: str) -> list[str]:
    expired = w.get("expired_at_router")
    footnote = (
        [f"     and {_plural(expired, 'held request')} gave up (503 at the router) before "
         f"{model} woke: those reach no ledger (status.idle.lastWake.expired)"]
        if expired else []
    )
    if not w["requests"]:
        return ["2. Waking: no request waited for a wake", *footnote]
    return [
        f"2. Waking: {_plural(w['requests'], 'request')} waited {_s(w['seconds'])} for "
        f"{model} to wake (median {_s(w['median_s'])}, longest {_s(w['longest_s'])}): held "
        "at the router before the gateway's queue",
        *footnote,
    ]


def _queueing_lines(q: Mapping[str, Any]) -> list[str]:
    if q["seconds"] <= 0:
        return ["3. Queueing: no request waited for a slot"]
    return [
        f"3. Queueing: {_plural(q['requests_waited'], 'request')} waited {_s(q['seconds'])} "
        "for a slot, behind:",
        *(f"     {b['caller']} ({b['priority']}) {_s(b['seconds'])}" for b in q["behind"]),
    ]


def _abandoned_lines(a: Mapping[str, Any]) -> list[str]:
    if not a["requests"]:
        return ["4. Abandoned work: none; every caller waited for its answer"]
    return [
        f"4. Abandoned work: {_plural(a['requests'], 'request')} whose caller left: "
        f"the slot was held {_s(a['held_before_gone_s'])} before they left (work thrown "
        f"away) and {_s(a['held_after_gone_s'])} after (cancellation latency)",
        *(
            f"     {c['caller']}: {_plural(c['requests'], 'request')}, "
            f"{_s(c['held_before_gone_s'])} before, {_s(c['held_after_gone_s'])} after"
            for c in a["callers"]
        ),
    ]


def _reread_lines(r: Mapping[str, Any]) -> list[str]:
    if not r["rewrites"]:
        return ["5. Re-reads: no session rewrote its prompt"]
    unknown = f" ({r['unknown']} not known)" if r["unknown"] else ""
    return [
        f"5. Re-reads: {_plural(r['rewrites'], 'rewritten prompt')} (compactions, "
        f"rewritten histories) re-read {_s(r['seconds'])} of prefill{unknown}:",
        *(
            f"     {s['caller']} / session {s['session']}: {_plural(s['rewrites'], 'rewrite')}, "
            f"{_s(s['seconds'])}" + (f" ({s['tokens']} tokens)" if s["tokens"] else "")
            for s in r["sessions"]
        ),
    ]


def _prefill_decode_lines(p: Mapping[str, Any], d: Mapping[str, Any]) -> list[str]:
    cache = (
        f", {p['cached_tokens']} reused from the engine's cache"
        if not p["cache_unknown"]
        else f", cache reuse not reported for {_plural(p['cache_unknown'], 'request')}"
    )
    rate = f", {d['tokens'] / d['seconds']:.1f} tok/s" if d["seconds"] > 0 else ""
    return [
        f"6. Prefill: {_s(p['seconds'])} besides re-reads ({p['evaluated_tokens']} tokens "
        f"evaluated{cache})",
        f"7. Decode: {_s(d['seconds'])} ({d['tokens']} tokens{rate})",
    ]


def _wall_lines(doc: Mapping[str, Any]) -> list[str]:
    if not doc["foreground"]:
        return []
    w = doc["foreground_wall"]
    waking = f"waking {_s(w['wake'])} + " if w["wake"] else ""
    return [
        "",
        f"Foreground wall time {_s(w['wall'])} = {waking}queueing {_s(w['queue'])} + re-reading "
        f"{_s(w['reread'])} + prefill {_s(w['prefill'])} + decode {_s(w['decode'])} + "
        f"other {_s(w['other'])}",
    ]


def _slowest_lines(slowest: Sequence[Mapping[str, Any]]) -> list[str]:
    if not slowest:
        return []
    out = ["", "Slowest foreground requests:"]
    for b in slowest:
        words = [f"queued {_s(b['queue_s'])}"]
        if b["waited_behind"]:
            words[0] += " behind " + _behind_words(b["waited_behind"])
        if b["wake_s"]:
            words.insert(0, f"waited {_s(b['wake_s'])} for a wake")
        if b["reread_s"]:
            words.append(f"re-read {_s(b['reread_s'])}")
        words += [
            f"prefill {_s(b['prefill_s'])}",
            f"decode {_s(b['decode_s'])}",
            f"other {_s(b['other_s'])}",
        ]
        session = f" session {b['session']}" if b["session"] else ""
        out.append(
            f"  {b['request_id']} {b['caller']}{session} ({b['outcome']}) "
            f"{_s(b['wall_s'])}: " + "; ".join(words)
        )
    return out


def to_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)
