"""The router's signing key in its Secret: made once, never overwritten,
its public half rendered into every gateway (docs/router.md, The router's
signing key).

With the router on (--router-namespace), the operator ensures the Secret
--router-signing-secret in that namespace holds an Ed25519 private key
(PEM, key `KEY_FIELD`): missing, it is created with a fresh key; present,
it is only read. The router's pods mount it (the chart); the gateways get
the public key (RenderOptions.router_key). Deleting the Secret rotates the
key: the next read makes a new one, every gateway re-renders with it, and
the router's pods must be restarted to read it (the chart's checksum does
not see a Secret the operator writes).

`signing_secret_plan` is the decision, pure: what exists -> what to create
and the public key. `RouterSigning` is the reading and the writing.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.contract import LABEL_COMPONENT
from localmodel.controller.writer import Kube, KubeError
from localmodel.gateway_contract.marks import BadKey, key_from_pem, pem_of, public_key_text
from localmodel.render import RenderOptions

if TYPE_CHECKING:
    from localmodel.controller.config import OperatorConfig

log = logging.getLogger("localmodel.signing")

KEY_FIELD = "signing-key.pem"  # the Secret's key the router's pods mount as a file
MAX_AGE_SECONDS = 60.0  # the Secret read again this often (a rotation is seen then)


class BadSigningSecret(ValueError):
    """The Secret exists but holds no usable key: never overwritten, so it is
    reported (the message names the Secret and the reason)."""


@dataclass(frozen=True)
class SigningPlan:
    """Decides the router's signing key: the public key to hand out, and the Secret to create when
    none exists."""

    public_key: str  # base64 of the raw public key, as --router-key takes it
    create: Mapping[str, Any] | None = None  # the Secret to create, when none exists
    # The key itself, to sign the operator's own calls (the gateways' POST /yield);
    # never printed: no repr, no comparison.
    private_key: Ed25519PrivateKey | None = field(default=None, repr=False, compare=False)


def signing_secret(namespace: str, name: str, pem: bytes) -> dict[str, Any]:
    """The Secret holding the router's private key."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        # Not OWNED_SELECTOR's label: no model owns it, nothing may collect it.
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL_COMPONENT: "router"}},
        "data": {KEY_FIELD: base64.b64encode(pem).decode("ascii")},
    }


def signing_secret_plan(existing: Mapping[str, Any] | None, namespace: str, name: str,
                        fresh: Callable[[], Ed25519PrivateKey]) -> SigningPlan:
    """What to do given the Secret as read (None: it does not exist): create
    it with `fresh()`'s key, or read the public key of the one there.
    BadSigningSecret when it exists but holds no Ed25519 key."""
    where = f"Secret {namespace}/{name}"
    if existing is None:
        key = fresh()
        return SigningPlan(public_key_text(key), signing_secret(namespace, name, pem_of(key)),
                           private_key=key)
    data = existing.get("data")
    raw = data.get(KEY_FIELD) if isinstance(data, Mapping) else None
    if not isinstance(raw, str):
        raise BadSigningSecret(f"{where}: no data.{KEY_FIELD} (delete it: the operator then "
                               "makes a new key)")
    try:
        pem = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise BadSigningSecret(f"{where}: data.{KEY_FIELD} is not base64") from None
    try:
        key = key_from_pem(pem)
    except BadKey as exc:
        raise BadSigningSecret(f"{where}: data.{KEY_FIELD}: {exc}") from None
    return SigningPlan(public_key_text(key), private_key=key)


class RouterSigning:
    """The router's public key as last read (""; none known yet), and its
    private key (None: none known yet; the operator signs its closes with
    it, `private_key`, never logged): read at most every MAX_AGE_SECONDS, the
    Secret created when missing."""

    def __init__(self, kube: Kube, namespace: str, name: str,
                 clock: Callable[[], float] = time.monotonic,
                 wake: Callable[[float], None] = lambda seconds: None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.clock = clock
        self.wake = wake  # a pass again in so many seconds: the next read is due
        self.key = ""
        self._private: Ed25519PrivateKey | None = None
        self._read_at: float | None = None

    def private_key(self) -> Ed25519PrivateKey | None:
        """The key the operator signs its closes with (the router's, so every
        gateway already holds its public half), as last read."""
        return self._private

    @classmethod
    def of(cls, kube: Kube, config: OperatorConfig,
           wake: Callable[[float], None]) -> RouterSigning | None:
        """With the router on (--router-namespace), else None."""
        if not config.router_namespace:
            return None
        return cls(kube, config.router_namespace, config.router_signing_secret, wake=wake)

    async def options(self, options: RenderOptions) -> RenderOptions:
        """`options` with the router's public key as now known; a pass is
        asked for when the next read is due, so a deleted Secret is seen
        within about MAX_AGE_SECONDS even when nothing else changes."""
        key = await self.public_key()
        due = MAX_AGE_SECONDS if self._read_at is None else (
            self._read_at + MAX_AGE_SECONDS - self.clock())
        self.wake(max(1.0, due))
        return options if key == options.router_key else replace(options, router_key=key)

    async def public_key(self) -> str:
        """The key to render; on a failure, the last one known (logged)."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < MAX_AGE_SECONDS:
            return self.key
        self._read_at = now
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{self.name}"
        try:
            try:
                existing = await self.kube.get(path)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                existing = None
            plan = signing_secret_plan(existing, self.namespace, self.name,
                                       Ed25519PrivateKey.generate)
            if plan.create is not None:
                try:
                    await self.kube.create(plan.create)
                    log.info("router signing key: created Secret %s/%s", self.namespace,
                             self.name)
                except KubeError as exc:
                    if exc.status != 409:  # 409: another made it first; read it next time
                        raise
                    self._read_at = None
                    return self.key
            self.key = plan.public_key
            self._private = plan.private_key
        except (KubeError, BadSigningSecret) as exc:
            log.error("router signing key: %s; gateways keep %s", exc,
                      "the last key read" if self.key else "no router key")
        return self.key
