"""What `kubectl localmodel status` and `why` print from the objects read.

Pure: the LocalModels, their gateways' metrics text (or why it was unreadable)
and the model's Events come in as read by kubectl.py, and what comes out is
the rows, the table and the text the plugin prints (or dumps as json/yaml).
Nothing here reads a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localmodel.doctor.metrics import GatewayStats, MetricsError, gateway_stats, parse_metrics

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ReplicaRow:
    """One line of `status`: a replica, or a model without any (replica None)."""

    namespace: str
    model: str  # the LocalModel's name
    serves: str  # spec.model
    engine: str
    ready: str  # status.ready, e.g. 1/2
    state: str  # the condition that says most (Stalled, Reconciling, else Ready)
    replica: int | None
    node: str | None
    pod: str | None
    threads: int | None
    slots: str | None  # busy/total
    queued: str | None  # foreground+background waiting
    decode_tps: float | None  # generated tokens per second of decoding, since start
    expected_tps: float | None  # status: the decode speed this replica should reach
    metrics_error: str | None


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def state_of(obj: Obj) -> str:
    """Stalled or Reconciling while True (they say why), else the Ready condition."""
    conds = _conditions(obj)
    for kind in ("Stalled", "Reconciling"):
        c = conds.get(kind)
        if c is not None and c.get("status") == "True":
            return f"{kind}: {c.get('reason', '')}"
    status = obj.get("status") or {}
    meta = obj.get("metadata") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return "Pending: not yet seen by the operator"
    ready = conds.get("Ready")
    if ready is None:
        return "Pending"
    slow = conds.get("SlowReplica")
    also = ", SlowReplica" if slow is not None and slow.get("status") == "True" else ""
    return f"Ready={ready.get('status')}: {ready.get('reason', '')}{also}"


def status_rows(models: Sequence[Obj],
                metrics: Mapping[str, str | Exception]) -> list[ReplicaRow]:
    """One row per placed replica (or per model without replicas), in name order.
    `metrics`: "namespace/pod" -> the gateway's metrics text, or why unreadable."""
    rows: list[ReplicaRow] = []
    for obj in sorted(models, key=lambda o: (o["metadata"].get("namespace", ""),
                                             o["metadata"]["name"])):
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        ns = str(meta.get("namespace", ""))
        common = {
            "namespace": ns, "model": str(meta["name"]), "serves": str(spec.get("model", "")),
            "engine": str((spec.get("engine") or {}).get("name", "")),
            "ready": str(status.get("ready") or "-"), "state": state_of(obj),
        }
        placements = sorted(status.get("placements") or [], key=lambda p: p.get("replica", 0))
        if not placements:
            rows.append(ReplicaRow(**common, replica=None, node=None, pod=None, threads=None,
                                   slots=None, queued=None, decode_tps=None, expected_tps=None,
                                   metrics_error=None))
            continue
        for p in placements:
            pod = str(p.get("pod", ""))
            stats, error = _stats(metrics.get(f"{ns}/{pod}"))
            rows.append(ReplicaRow(
                **common, replica=int(p.get("replica", 0)), node=str(p.get("node", "")),
                pod=pod, threads=p.get("threads"),
                slots=f"{stats.slots_busy}/{stats.slots}" if stats else None,
                queued=(f"{stats.queued_foreground}+{stats.queued_background}"
                        if stats else None),
                decode_tps=stats.decode_tps if stats else None,
                expected_tps=(p.get("speed") or {}).get("expectedDecode"),
                metrics_error=error,
            ))
    return rows


def _stats(text: str | Exception | None) -> tuple[GatewayStats | None, str | None]:
    if text is None:
        return None, None
    if isinstance(text, Exception):
        return None, str(text)
    try:
        return gateway_stats(parse_metrics(text)), None
    except MetricsError as e:
        return None, str(e)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    out = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
           for row in [list(header), *lines]]
    return "\n".join(out) + "\n"


def status_table(rows: Sequence[ReplicaRow], *, all_namespaces: bool) -> str:
    """kubectl-style columns; QUEUE is foreground+background requests waiting,
    TOK/S the replica's decode speed since its gateway started, EXPECTED the speed
    the operator expects of it (status.placements[].speed, docs/operator.md)."""
    header = ["NAME", "MODEL", "ENGINE", "READY", "REPLICA", "NODE", "THREADS", "SLOTS",
              "QUEUE", "TOK/S", "EXPECTED", "STATE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    lines = []
    for r in rows:
        speed = _cell(r.decode_tps)
        if r.metrics_error and r.pod:
            speed = "?"
        line = [r.model, r.serves, r.engine, r.ready, _cell(r.replica), _cell(r.node),
                _cell(r.threads), _cell(r.slots), _cell(r.queued), speed,
                _cell(None if r.expected_tps is None else float(r.expected_tps)), r.state]
        if all_namespaces:
            line.insert(0, r.namespace)
        lines.append(line)
    text = table(header, lines)
    unread = [r for r in rows if r.metrics_error and r.pod]
    if unread:
        text += "\n? metrics unreadable:\n" + "".join(
            f"  {r.namespace}/{r.pod}: {r.metrics_error}\n" for r in unread)
    return text


def why_data(obj: Obj) -> dict[str, Any]:
    """The parts of a LocalModel that say why it runs as it does."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    return {
        "namespace": meta.get("namespace"), "name": meta["name"],
        "model": spec.get("model"), "engine": (spec.get("engine") or {}).get("name"),
        "generation": meta.get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "state": state_of(obj),
        "conditions": [{k: c.get(k) for k in ("type", "status", "reason", "message")}
                       for c in status.get("conditions") or []],
        "placements": [{
            "replica": p.get("replica"), "node": p.get("node"), "pod": p.get("pod"),
            "threads": p.get("threads"), "cpu": p.get("cpu"), "memory": p.get("memory"),
            "reason": p.get("reason", ""),
            "decisions": [{k: d.get(k) for k in ("rule", "effect", "reason", "source")}
                          for d in p.get("decisions") or []],
        } for p in sorted(status.get("placements") or [], key=lambda p: p.get("replica", 0))],
    }


def why_text(obj: Obj, events: Sequence[Obj] = ()) -> str:
    """Conditions, then each replica's placement and decisions, then recent Events."""
    d = why_data(obj)
    lines = [f"LocalModel {d['namespace']}/{d['name']}: model {d['model']} on {d['engine']}, "
             f"generation {d['generation']} (observed {d['observedGeneration']})",
             f"State: {d['state']}", ""]
    if d["conditions"]:
        lines.append(table(["CONDITION", "STATUS", "REASON", "MESSAGE"], [
            [str(c["type"]), str(c["status"]), str(c["reason"]), str(c["message"] or "")]
            for c in d["conditions"]]).rstrip("\n"))
    else:
        lines.append("No conditions yet: the operator has not reported on this model.")
    for p in d["placements"]:
        lines += ["", f"Replica {p['replica']} on node {p['node']} (pod {p['pod']}): "
                      f"threads={p['threads']} cpu={p['cpu']} memory={p['memory']}"]
        if p["reason"]:
            lines.append(f"  placed: {p['reason']}")
        if p["decisions"]:
            lines.append(table(["RULE", "EFFECT", "REASON", "SOURCE"], [
                [str(x["rule"]), str(x["effect"]), str(x["reason"]), str(x["source"])]
                for x in p["decisions"]]).rstrip("\n"))
        else:
            lines.append("  no rule changed the engine's defaults")
    if events:
        lines += ["", "Recent events:"]
        for e in events:
            lines.append(f"  {e.get('lastTimestamp') or e.get('eventTime') or '-'}  "
                         f"{e.get('type', '')}  {e.get('reason', '')}: {e.get('message', '')}")
    return "\n".join(lines) + "\n"
