"""The cluster admin's policy over tenants, and the check of a model against it. Pure.

A tenant who may create LocalModels in their namespace chooses images, an
overflow host, the Secrets the model's pods read (`SECRET_REFS`: the overflow
key, the API keys file), tolerations and whether to hold nodes alone. The
admin's `TenantPolicy` (the chart's `policy` values, mounted as a file the
operator and `localmodel render --policy` read) bounds each of those choices;
`refusals(model, policy, secrets)` names every rule a model breaks, each with
the field it refuses. A refused model is `Valid=False`
(`RefusedByPolicy`) and nothing is created for it (controller/plan.py).

Each rule is one entry of `RULES` and one field of `TenantPolicy` (named as
the chart's value is: `policy.<name>`; `controlPlaneTaints` is the list
`allowControlPlane` judges by); `FIELDS` says how its value is read.
Adding a rule is one field, one `FIELDS` entry and one check function. The
defaults keep what a single-team install did before the policy existed,
except control-plane tolerations (docs/security.md says why for each).
tests/controller/test_tenancy.py tables one case per rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from localmodel.api import LocalModel, LocalModelSpec, SecretKeyRef
from localmodel.errors import FieldError

ANY = "*"
# Taint keys of nodes that run the cluster itself, the default of
# `policy.controlPlaneTaints` (a toleration of one is `allowControlPlane`'s):
CONTROL_PLANE_TAINTS = (
    # kubeadm's control-plane taint (since 1.20; kubeadm's "Control plane
    # node isolation"), and the one before it (kubeadm up to 1.24).
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
    # RKE1 (Rancher Kubernetes Engine): its controlplane and etcd roles taint
    # their nodes with these keys (RKE docs, "Node roles" / role taints).
    "node-role.kubernetes.io/controlplane",
    "node-role.kubernetes.io/etcd",
    # The convention for nodes kept for critical add-ons, first the
    # Kubernetes rescheduler's taint, now AKS's recommended taint for system
    # node pools (CriticalAddonsOnly=true:NoSchedule) and EKS Auto Mode's
    # system pool's: only pods that tolerate it run there; a model is not one.
    "CriticalAddonsOnly",
)
DOCKER_HUB = "docker.io"
MAX_ENTRIES = 256  # per list: a policy is a short list an admin writes

_REGISTRY = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._/-]+)?$")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class LabelRule:
    """A Secret must carry label `key` (with `value`, when given)."""

    key: str
    value: str | None = None

    def __str__(self) -> str:
        return self.key if self.value is None else f"{self.key}={self.value}"

    def holds(self, labels: Mapping[str, str]) -> bool:
        return self.key in labels and (self.value is None or labels[self.key] == self.value)


@dataclass(frozen=True)
class TenantPolicy:
    """What tenants may choose. `("*",)` allows any; an empty list allows none."""

    image_registries: tuple[str, ...] = (ANY,)
    overflow_hosts: tuple[str, ...] = (ANY,)
    secret_label: LabelRule | None = None
    allow_control_plane: bool = False
    control_plane_taints: tuple[str, ...] = CONTROL_PLANE_TAINTS
    exclusive_namespaces: tuple[str, ...] = (ANY,)
    # Not read from the policy file: the operator's --image-registry, under
    # which a model that names no engine image runs the pinned one. The policy
    # judges the image a pod would run, so that one is judged (the setting is
    # not added to image_registries: list it there when you narrow them).
    image_registry: str = ""


class PolicyError(ValueError):
    """A policy that cannot be used: every field that is wrong."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(str(e) for e in errors))


# ---- reading a policy --------------------------------------------------------------

Read = Callable[[str, Any], Any]  # (field name, raw value) -> value, or FieldError


def _entries(check: re.Pattern[str], words: str) -> Read:
    def read(name: str, raw: Any) -> tuple[str, ...]:
        if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
            raise FieldError(name, f"must be a list of at most {MAX_ENTRIES} strings")
        out: list[str] = []
        for i, item in enumerate(raw):
            if not isinstance(item, str) or not (item == ANY or check.match(item)):
                raise FieldError(f"{name}[{i}]", f"must be {words} (lower case), or {ANY!r} "
                                 "for any")
            out.append(item)
        return tuple(out)
    return read


def _taint_keys(name: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise FieldError(name, f"must be a list of at most {MAX_ENTRIES} taint keys")
    for i, item in enumerate(raw):
        if not isinstance(item, str) or len(item) > 316 or not _LABEL_KEY.match(item):
            raise FieldError(f"{name}[{i}]", f"{item!r} is not a taint key ([prefix/]name, "
                             "as node-role.kubernetes.io/control-plane)")
    return tuple(raw)


def _boolean(name: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise FieldError(name, "must be true or false")
    return raw


def _label(name: str, raw: Any) -> LabelRule | None:
    if raw in (None, ""):
        return None
    if not isinstance(raw, str):
        raise FieldError(name, "must be a label, KEY or KEY=VALUE")
    key, eq, value = raw.partition("=")
    if not _LABEL_KEY.match(key) or len(key) > 316 or not _LABEL_VALUE.match(value):
        raise FieldError(name, f"{raw!r} is not a label selector KEY or KEY=VALUE")
    return LabelRule(key, value if eq else None)


# policy.<name> -> (TenantPolicy field, reader)
FIELDS: dict[str, tuple[str, Read]] = {
    "imageRegistries": ("image_registries", _entries(
        _REGISTRY, "a registry host[:port], optionally with a path prefix (ghcr.io/org)")),
    "overflowHosts": ("overflow_hosts", _entries(
        _HOST, "a host name[:port], or *.domain for its subdomains")),
    "secretLabel": ("secret_label", _label),
    "allowControlPlane": ("allow_control_plane", _boolean),
    "controlPlaneTaints": ("control_plane_taints", _taint_keys),
    "exclusiveNamespaces": ("exclusive_namespaces", _entries(_NAMESPACE, "a namespace name")),
}
# A setting's older name -> its name (read as it; both given must agree).
OLDER_NAMES = {"overflowKeySecretLabel": "secretLabel"}
assert {f for f, _ in FIELDS.values()} | {"image_registry"} == {
    f.name for f in fields(TenantPolicy)}


def parse_policy(raw: Any) -> TenantPolicy:
    """A policy from its mapping (the chart's `policy` values); PolicyError naming
    every wrong field. Missing fields keep their defaults; unknown ones are refused."""
    if raw is None:
        return TenantPolicy()
    if not isinstance(raw, Mapping):
        raise PolicyError([FieldError("", "the policy must be a mapping")])
    errors: list[FieldError] = []
    values: dict[str, Any] = {}
    for given, value in raw.items():
        name = OLDER_NAMES.get(given, given)
        if name not in FIELDS:
            errors.append(FieldError(str(given), f"unknown policy setting (known: "
                                                 f"{', '.join(FIELDS)})"))
            continue
        attr, read = FIELDS[name]
        try:
            got = read(given, value)
        except FieldError as e:
            errors.append(e)
            continue
        if attr in values:  # (a setting and its older name, OLDER_NAMES)
            if None not in (got, values[attr]) and got != values[attr]:
                errors.append(FieldError(str(given), f"the older name of {name}, which says "
                                         "otherwise: give one of them"))
                continue
            got = values[attr] if got is None else got
        values[attr] = got
    if errors:
        raise PolicyError(errors)
    return TenantPolicy(**values)


# ---- the check ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """One rule a model breaks: the policy setting, the field and why."""

    rule: str  # the setting's name (policy.<rule> in the chart's values)
    field: str  # the spec's field path
    reason: str

    def error(self) -> FieldError:
        return FieldError(self.field, f"refused by the admin policy (policy.{self.rule}): "
                                      f"{self.reason}")


# (namespace, Secret name) -> its labels; a Secret absent here was not found or not read
SecretLabels = Mapping[tuple[str, str], Mapping[str, str]]


def image_location(image: str) -> str:
    """`registry/path` of an image reference, normalised as the container runtime
    does (no registry: docker.io; one name: docker.io/library/NAME), without its
    tag or digest."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"{first.lower()}/{rest}"
    return f"{DOCKER_HUB}/{name if rest else 'library/' + name}"


def registry_allowed(image: str, allowed: tuple[str, ...]) -> bool:
    where = image_location(image) + "/"
    return any(a == ANY or where.startswith(a.rstrip("/") + "/") for a in allowed)


def host_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return False
    for a in allowed:
        want, _, want_port = a.partition(":")
        if want_port and (port is None or int(want_port) != port):
            continue
        if a == ANY or host == want or (want.startswith("*.") and host.endswith(want[1:])):
            return True
    return False


def _shown(allowed: tuple[str, ...]) -> str:
    return ", ".join(allowed) if allowed else "none"


def _registries(lm: LocalModel, policy: TenantPolicy, _: SecretLabels) -> Iterator[Refusal]:
    allowed = policy.image_registries
    spec = lm.spec
    pinned = "" if spec.engine.image else " (the engine's pinned image" + (
        f", under the operator's --image-registry {policy.image_registry})"
        if policy.image_registry else ")")
    images = [("spec.engine.image", spec.engine.resolved_image(policy.image_registry), pinned)]
    if spec.gateway.enabled and spec.gateway.image:  # (else the admin's own gateway image)
        images.append(("spec.gateway.image", spec.gateway.image, ""))
    for field, image, chosen in images:
        if not registry_allowed(image, allowed):
            yield Refusal("imageRegistries", field, f"{image}{chosen} comes from "
                          f"{image_location(image)}, not an allowed registry "
                          f"(allowed: {_shown(allowed)})")


def _overflow_hosts(lm: LocalModel, policy: TenantPolicy, _: SecretLabels) -> Iterator[Refusal]:
    overflow = lm.spec.gateway.overflow
    if lm.spec.gateway.enabled and overflow and not host_allowed(overflow.url,
                                                                 policy.overflow_hosts):
        host = urlsplit(overflow.url).netloc.rpartition("@")[2]
        yield Refusal("overflowHosts", "spec.gateway.overflow.url",
                      f"host {host} is not an allowed overflow host "
                      f"(allowed: {_shown(policy.overflow_hosts)})")


# Every Secret a LocalModel can name, by the field that names it, and how to
# find it in a spec (None: not named): the one list
# `policy.secretLabel` checks and the operator reads labels for. A new
# SecretKeyRef in the API fails tests/controller/test_tenancy_secrets.py until it is
# listed here. (Both are the gateway's: the API refuses them with it off.)
def _keys_file(spec: LocalModelSpec) -> SecretKeyRef | None:
    return spec.gateway.auth.keys_secret_ref if spec.gateway.auth is not None else None


def _overflow_key(spec: LocalModelSpec) -> SecretKeyRef | None:
    overflow = spec.gateway.overflow
    return overflow.api_key_secret_ref if overflow is not None else None


SECRET_REFS: tuple[tuple[str, Callable[[LocalModelSpec], SecretKeyRef | None]], ...] = (
    ("spec.gateway.auth.keysSecretRef", _keys_file),
    ("spec.gateway.overflow.apiKeySecretRef", _overflow_key),
)


def named_secrets(lm: LocalModel) -> tuple[tuple[str, str], ...]:
    """(field, Secret name) of each Secret `lm` names."""
    return tuple((field, ref.name) for field, find in SECRET_REFS
                 if (ref := find(lm.spec)) is not None)


def _secrets(lm: LocalModel, policy: TenantPolicy, secrets: SecretLabels) -> Iterator[Refusal]:
    rule = policy.secret_label
    if rule is None:
        return
    for path, name in named_secrets(lm):
        labels = secrets.get((lm.metadata.namespace, name))
        field = f"{path}.name"
        if labels is None:
            yield Refusal("secretLabel", field, f"Secret {name} was not found (or may not be "
                          f"read), so its label {rule} cannot be checked")
        elif not rule.holds(labels):
            yield Refusal("secretLabel", field, f"Secret {name} does not carry the label "
                          f"{rule} that marks a Secret a LocalModel may name")


def _control_plane(lm: LocalModel, policy: TenantPolicy, _: SecretLabels) -> Iterator[Refusal]:
    if policy.allow_control_plane:
        return
    for i, t in enumerate(lm.spec.placement.tolerations):
        if t.operator.value == "Exists" and not t.key:
            what = "tolerates every taint (operator Exists without a key)"
        elif t.key in policy.control_plane_taints:
            what = f"tolerates {t.key} (a control-plane taint: policy.controlPlaneTaints)"
        else:
            continue
        yield Refusal("allowControlPlane", f"spec.placement.tolerations[{i}]",
                      f"{what}, so the model could run on control-plane nodes; name the "
                      "taints it may tolerate instead")


def _exclusive(lm: LocalModel, policy: TenantPolicy, _: SecretLabels) -> Iterator[Refusal]:
    allowed = policy.exclusive_namespaces
    namespace = lm.metadata.namespace
    if lm.spec.placement.exclusive and ANY not in allowed and namespace not in allowed:
        yield Refusal("exclusiveNamespaces", "spec.placement.exclusive",
                      f"namespace {namespace} may not hold nodes exclusively (allowed: "
                      f"{_shown(allowed)}); set placement.exclusive: false")


Rule = Callable[[LocalModel, TenantPolicy, SecretLabels], Iterator[Refusal]]
RULES: tuple[Rule, ...] = (_registries, _overflow_hosts, _secrets, _control_plane, _exclusive)


def refusals(lm: LocalModel, policy: TenantPolicy, secrets: SecretLabels | None = None
             ) -> tuple[Refusal, ...]:
    """Every rule of `policy` that `lm` breaks (none: the model is admitted).
    `secrets`: the labels of the Secrets models name (`needs_secrets`)."""
    return tuple(r for rule in RULES for r in rule(lm, policy, secrets or {}))


def needs_secrets(lm: LocalModel, policy: TenantPolicy) -> tuple[tuple[str, str], ...]:
    """The Secrets (namespace, name) whose labels the policy must see for `lm`."""
    if policy.secret_label is None:
        return ()
    return tuple(dict.fromkeys((lm.metadata.namespace, name) for _, name in named_secrets(lm)))
