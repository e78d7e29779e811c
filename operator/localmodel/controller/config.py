"""Operator settings: flags, each also readable from LOCALMODEL_<FLAG>. Pure.

`parse_config(argv, env)` returns a frozen `OperatorConfig` or raises
`ConfigError` (the gateway's: one type for bad flags) naming the flag.
Flags win over the environment; the environment wins over the defaults.
`--kubeconfig` also falls back to KUBECONFIG, then to the in-cluster service
account.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

# One error type for "this flag (or its variable) has a value we cannot use",
# shared with the gateway's flags.
from localmodel.gateway.config import ConfigError
from localmodel.render import DEFAULT_OPERATOR_IMAGE

__all__ = ["ConfigError", "OperatorConfig", "parse_config"]

ENV_PREFIX = "LOCALMODEL_"
LogFormat = Literal["json", "text"]


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None = None  # None: in-cluster
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    metrics_listen: tuple[str, int] | None = ("0.0.0.0", 9090)
    health_listen: tuple[str, int] | None = ("0.0.0.0", 8081)
    log_format: LogFormat = "text"
    # Leader election: a coordination.k8s.io Lease in this namespace.
    leader_namespace: str = "localmodel-system"
    leader_name: str = "localmodel-operator"
    identity: str = ""
    lease_seconds: float = 12.0
    renew_seconds: float = 3.0
    # A pass runs this long after the last change it was woken for (burst
    # coalescing), and at most this long after the first.
    debounce_seconds: float = 0.2
    max_delay_seconds: float = 1.0
    # A pod the scheduler leaves Unschedulable this long rejects its node for
    # its model (the planner cannot see everything the scheduler checks, such as
    # a free local volume on that node).
    unschedulable_seconds: float = 60.0
    write_concurrency: int = 16


def _listen(flag: str, raw: str) -> tuple[str, int] | None:
    if raw in ("", "off", "0"):
        return None
    host, sep, port = raw.rpartition(":")
    if not sep:
        host, port = "0.0.0.0", raw
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(flag, f"expected HOST:PORT, PORT or off, got {raw!r}") from None
    if not 0 < number < 65536:
        raise ConfigError(flag, f"port must be 1..65535, got {raw!r}")
    return (host or "0.0.0.0", number)


def _positive(flag: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(flag, f"expected a number of seconds > 0, got {raw!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localmodel run",
        description="Run the operator: watch LocalModels, Nodes and Pods, place and tune "
        "every model, keep its objects and status true. Every flag can also be set as "
        f"{ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}LOG_FORMAT=json).",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                   help="watch only this namespace (repeatable; default: all namespaces)")
    p.add_argument("--operator-image", help="image of the gateway sidecar")
    p.add_argument("--metrics-listen", help="HOST:PORT for /metrics, or off (default 0.0.0.0:9090)")
    p.add_argument("--health-listen",
                   help="HOST:PORT for /healthz and /readyz, or off (default 0.0.0.0:8081)")
    p.add_argument("--log-format", choices=["json", "text"])
    p.add_argument("--leader-namespace",
                   help="namespace of the leader-election Lease (default: $POD_NAMESPACE, "
                   "else localmodel-system)")
    p.add_argument("--leader-name", help="name of the Lease (default localmodel-operator)")
    p.add_argument("--identity", help="this replica's holder identity (default: host name + pid)")
    p.add_argument("--lease-seconds", help="Lease duration: failover time after a crash")
    p.add_argument("--unschedulable-seconds",
                   help="how long a pod may stay Unschedulable before its node is rejected")
    return p


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> OperatorConfig:
    """Flags, then LOCALMODEL_* variables, then defaults."""
    args = _parser().parse_args(list(argv))

    def pick(flag: str) -> str | None:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            return str(value)
        return env.get(ENV_PREFIX + flag.upper().replace("-", "_"))

    base = OperatorConfig()
    kubeconfig = pick("kubeconfig") or env.get("KUBECONFIG") or None
    namespaces: tuple[str, ...]
    if args.namespaces:
        namespaces = tuple(args.namespaces)
    else:
        raw_ns = env.get(ENV_PREFIX + "NAMESPACE", "")
        namespaces = tuple(n for n in raw_ns.replace(",", " ").split() if n)
    log_format = pick("log-format") or base.log_format
    if log_format not in ("json", "text"):
        raise ConfigError("log-format", f"expected json or text, got {log_format!r}")
    metrics = pick("metrics-listen")
    health = pick("health-listen")
    lease = pick("lease-seconds")
    unsched = pick("unschedulable-seconds")
    lease_seconds = _positive("lease-seconds", lease) if lease else base.lease_seconds
    return OperatorConfig(
        kubeconfig=kubeconfig,
        namespaces=namespaces,
        operator_image=pick("operator-image") or base.operator_image,
        metrics_listen=_listen("metrics-listen", metrics) if metrics is not None
        else base.metrics_listen,
        health_listen=_listen("health-listen", health) if health is not None
        else base.health_listen,
        log_format=log_format,  # type: ignore[arg-type]
        leader_namespace=pick("leader-namespace") or env.get("POD_NAMESPACE")
        or base.leader_namespace,
        leader_name=pick("leader-name") or base.leader_name,
        identity=pick("identity") or "",
        lease_seconds=lease_seconds,
        renew_seconds=max(0.5, lease_seconds / 4),
        unschedulable_seconds=_positive("unschedulable-seconds", unsched) if unsched
        else base.unschedulable_seconds,
    )
