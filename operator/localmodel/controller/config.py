"""Operator settings: flags, each also readable from LOCALMODEL_<FLAG>. Pure.

`parse_config(argv, env)` returns a frozen `OperatorConfig` or raises
`ConfigError` (`localmodel.settings`'s, as the gateway's) naming the flag.
Each setting is written once, in `OperatorConfig` (default, help, parser).
Flags win over the environment; the environment wins over the defaults.
`--kubeconfig` also falls back to KUBECONFIG, then to the in-cluster service
account.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from localmodel import speed
from localmodel.idle.asks import IdleSettings
from localmodel.images import pull_secrets_error, registry_error
from localmodel.manifest import ManifestError, documents
from localmodel.render.names import DEFAULT_OPERATOR_IMAGE
from localmodel.settings import (
    ConfigError,
    as_is,
    field_values,
    flags,
    http_url,
    listen_or_off,
    one_of,
    pick,
    positive_seconds,
    setting,
    split_words,
)
from localmodel.tenancy import PolicyError, TenantPolicy, parse_policy

__all__ = ["ConfigError", "OperatorConfig", "parse_config", "policy_file"]

ENV_PREFIX = "LOCALMODEL_"
LogFormat = Literal["json", "text"]


def read_policy(path: str) -> TenantPolicy:
    """The policy in a YAML or JSON file (one mapping, read with manifest's
    limits); ValueError naming the file and each wrong field."""
    try:
        docs = [doc for _, doc in documents(path)]
    except ManifestError as e:
        raise ValueError(str(e)) from None
    if len(docs) > 1:
        raise ValueError(f"{path}: one policy mapping expected, found {len(docs)} documents")
    try:
        return parse_policy(docs[0] if docs else None)
    except PolicyError as e:
        raise ValueError("; ".join(f"{path}: policy.{err}" for err in e.errors)) from None


def policy_file(flag: str, raw: str) -> TenantPolicy:
    try:
        return read_policy(raw)
    except ValueError as e:
        raise ConfigError(flag, str(e)) from None


def _namespace_or_none(flag: str, raw: str) -> str:
    name = raw.strip()
    if name and (len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)):
        raise ConfigError(flag, f"{name!r} is not a namespace's name")
    return name


def _secret_name(flag: str, raw: str) -> str:
    name = raw.strip()
    if len(name) > 253 or not re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", name):
        raise ConfigError(flag, f"{name!r} is not a Secret's name (lower case DNS subdomain)")
    return name


def _true_or_false(flag: str, raw: str) -> bool:
    """`true` or `false`, nothing else (no silent coercion of `yes` or `1`)."""
    if raw not in ("true", "false"):
        raise ConfigError(flag, f"must be true or false, not {raw!r}")
    return raw == "true"


def image_registry(flag: str, raw: str) -> str:
    """host[:port][/path] (localmodel/images.py), or ConfigError saying why not."""
    if why := registry_error(raw):
        raise ConfigError(flag, why)
    return raw


def pull_secrets(flag: str, raw: str) -> tuple[str, ...]:
    """Secret names, with commas and/or spaces, or ConfigError saying why not."""
    names = split_words(flag, raw)
    if why := pull_secrets_error(names):
        raise ConfigError(flag, why)
    return names


@dataclass(frozen=True)
class OperatorConfig:
    """The operator's settings: one declaration per flag (default, help, parser), parsed by
    `parse_config`."""

    kubeconfig: str | None = setting(
        None, "kubeconfig file", metavar="FILE", shown_default="$KUBECONFIG, else in-cluster",
        fallback_env=("KUBECONFIG",), parse=as_is,
    )
    namespaces: tuple[str, ...] = setting(
        (), "watch only this namespace, repeatable", flag="namespace", metavar="NS",
        shown_default="all namespaces", repeatable=True, parse=split_words,
    )
    # The admin's policy over tenants (localmodel.tenancy; the chart's `policy`
    # values, mounted as a file): a model it refuses is Valid=False, nothing made.
    tenants: TenantPolicy = setting(
        TenantPolicy(), "the admin's policy over tenants: a YAML file of the chart's `policy` "
        "values (docs/security.md)", flag="policy", metavar="FILE",
        shown_default="any registry, overflow host and Secret; no tolerations for control planes",
        parse=policy_file,
    )
    operator_image: str = setting(
        DEFAULT_OPERATOR_IMAGE, "image of the gateway sidecar", metavar="IMAGE", parse=as_is
    )
    # The one registry setting (localmodel/images.py): every image the operator
    # chooses (the gateway and download step's --operator-image, each engine's
    # pinned image) comes from it; an image a LocalModel names is kept.
    image_registry: str = setting(
        "", "take every image the operator chooses from this registry, host[:port][/path]: "
        "its host replaces the image's, its path is kept (docs/operator.md, Your own registry)",
        metavar="REGISTRY", parse=image_registry,
    )
    image_pull_secrets: tuple[str, ...] = setting(
        (), "Secrets every model pod pulls its images with (each must exist in the model's "
        "namespace)", metavar="SECRET,...", parse=pull_secrets,
    )
    # Off: GGUF downloads over https only (docs/security.md, Hardened pods
    # and downloads); on, plain http too, still never https -> http.
    allow_http_downloads: bool = setting(
        False, "let model pods download GGUF files over plain http (true or false)",
        metavar="BOOL", shown_default="false", parse=_true_or_false,
    )
    metrics_listen: tuple[str, int] | None = setting(
        ("0.0.0.0", 9090), "HOST:PORT for /metrics, or off", metavar="HOST:PORT",
        empty_is_value=True, parse=listen_or_off("0.0.0.0"),
    )
    health_listen: tuple[str, int] | None = setting(
        ("0.0.0.0", 8081), "HOST:PORT for /healthz and /readyz, or off", metavar="HOST:PORT",
        empty_is_value=True, parse=listen_or_off("0.0.0.0"),
    )
    log_format: LogFormat = setting(
        "text", "log lines as json or text", metavar="FORMAT", choices=("json", "text"),
        parse=one_of("json", "text"),
    )
    # Leader election: a coordination.k8s.io Lease in this namespace.
    leader_namespace: str = setting(
        "localmodel-system",
        "namespace of the leader-election Lease (default $POD_NAMESPACE, else {default})",
        metavar="NS", fallback_env=("POD_NAMESPACE",), parse=as_is,
    )
    leader_name: str = setting("localmodel-operator", "name of the Lease", metavar="NAME",
                               parse=as_is)
    identity: str = setting(
        "", "this replica's Lease holder identity (default host name, pid and a random suffix)",
        metavar="ID", parse=as_is,
    )
    lease_seconds: float = setting(
        12.0, "Lease duration: failover time after a crash", metavar="S", parse=positive_seconds
    )
    renew_seconds: float = 3.0  # a quarter of --lease-seconds, at least 0.5
    # A pass runs this long after the last change it was woken for (burst
    # coalescing), and at most this long after the first.
    debounce_seconds: float = 0.2
    max_delay_seconds: float = 1.0
    # The planner cannot see everything the scheduler checks, such as a free
    # local volume on that node.
    unschedulable_seconds: float = setting(
        60.0, "how long a pod may stay Unschedulable before its node is rejected for its model",
        metavar="S", parse=positive_seconds,
    )
    write_concurrency: int = 16
    # Who may reach a model (render/policy.py): the default of
    # spec.gateway.networkPolicy.enabled, and the namespaces (besides the
    # operator's own) whose pods may read the gateways' admin port.
    network_policy: bool = setting(
        False, "add a NetworkPolicy per model unless its spec says otherwise (true/false)",
        shown_default="false", metavar="BOOL", parse=_true_or_false,
    )
    admin_namespaces: tuple[str, ...] = setting(
        (), "namespaces besides the operator's own whose pods may read the gateways' admin "
        "port (metrics, speed, ledger) under a model's NetworkPolicy, e.g. Prometheus's",
        metavar="NS,...", parse=split_words,
    )
    router_namespace: str = setting(
        "", "namespace of the router's pods (app.kubernetes.io/component=router), admitted "
        "to the inference and admin ports under a model's NetworkPolicy; empty: no router",
        shown_default="none", metavar="NS", parse=_namespace_or_none,
    )
    # The router's signing key (controller/signing.py): made in this Secret of
    # --router-namespace when missing; its public key goes to every gateway.
    router_signing_secret: str = setting(
        "localmodel-router-signing", "the Secret in --router-namespace holding the router's "
        "signing key (created when missing, never overwritten)", metavar="NAME",
        parse=_secret_name,
    )
    # spec.idle (docs/idle.md): what a released model's doorman names to its
    # callers, the quiet time a yield asks of a gateway, how long a node given
    # by a yield waits for its waker (idle/asks.py IdleSettings).
    router_url: str = setting(
        "", "the router's address a released model's doorman names to its callers (the "
        "chart's router Service, e.g. http://localmodel-router.localmodel:80)",
        shown_default="none: not named", metavar="URL", parse=http_url,
    )
    yield_grace: float = setting(
        30.0, "seconds a model must have been quiet on every replica to be asked to give its "
        "node to a waking model (also how long a refused ask is not repeated)",
        metavar="S", parse=positive_seconds,
    )
    reserve_seconds: float = setting(
        120.0, "seconds a node given by a yield stays reserved for the waking model it was "
        "given to", metavar="S", parse=positive_seconds,
    )
    # Speed where it is served (docs/operator.md, Speed): each Ready replica's
    # gateway is read for its speed at most once per interval, and only while
    # it has traffic; a replica below speed.SLOW_RATIO of its expected decode
    # rate for --slow-replica-after seconds of traffic turns SlowReplica true.
    speed_interval: float = setting(
        speed.READ_INTERVAL_SECONDS,
        "read a replica's gateway speed at most this often, while it has traffic",
        metavar="S", parse=positive_seconds,
    )
    speed_idle_interval: float = setting(
        speed.IDLE_MAX_SECONDS,
        "read a replica whose last read found no traffic again after this long",
        metavar="S", parse=positive_seconds,
    )
    slow_replica_after: float = setting(
        speed.SLOW_AFTER_SECONDS,
        f"seconds of traffic below {speed.SLOW_RATIO:g} of the expected decode rate before "
        "SlowReplica",
        metavar="S", parse=positive_seconds,
    )
    slow_replica_clear_after: float = setting(
        speed.CLEAR_AFTER_SECONDS,
        f"seconds of traffic at {speed.CLEAR_RATIO:g} of the expected rate or more before "
        "SlowReplica clears",
        metavar="S", parse=positive_seconds,
    )

    @property
    def speed_policy(self) -> speed.SpeedPolicy:
        return speed.SpeedPolicy(
            slow_after=self.slow_replica_after, clear_after=self.slow_replica_clear_after,
            interval=self.speed_interval,
            idle_max=max(self.speed_interval, self.speed_idle_interval),
            publish_max=max(self.speed_interval, speed.PUBLISH_MAX_SECONDS),
        )

    @property
    def idle_settings(self) -> IdleSettings:
        """The idle decisions' settings: a router runs when it has a namespace."""
        return IdleSettings(router=bool(self.router_namespace), grace_s=self.yield_grace,
                            reserve_s=self.reserve_seconds)


FLAGS = flags(OperatorConfig)



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localmodel run",
        description="Run the operator: watch LocalModels, Nodes and Pods, place and tune "
        "every model, keep its objects and status true. Every flag can also be set as "
        f"{ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}LOG_FORMAT=json).",
    )
    for flag in FLAGS.values():
        extra: dict[str, Any] = {"action": "append"} if flag.spec.repeatable else {}
        if flag.spec.choices:
            extra["choices"] = flag.spec.choices
        else:
            extra["metavar"] = flag.spec.metavar
        p.add_argument(f"--{flag.name}", dest=flag.name, help=flag.help, **extra)
    return p


def _given(value: str | list[str] | None) -> str | None:
    """A repeated flag's values as one list (the form its variable takes)."""
    if isinstance(value, list):
        return ",".join(value)
    return value


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> OperatorConfig:
    """Flags, then LOCALMODEL_* variables, then fallback variables, then defaults."""
    args = vars(_parser().parse_args(list(argv)))
    raw: dict[str, str] = {}
    for name, flag in FLAGS.items():
        value = pick(flag, _given(args[name]), env, ENV_PREFIX)
        if value is not None:
            raw[name] = value
    values = field_values(FLAGS, raw)
    if values.get("image_registry"):  # the policy judges the images pods would run
        values["tenants"] = dataclasses.replace(values.get("tenants", TenantPolicy()),
                                                image_registry=values["image_registry"])
    lease = values.get("lease_seconds", OperatorConfig.lease_seconds)
    return OperatorConfig(**values, renew_seconds=max(0.5, lease / 4))
