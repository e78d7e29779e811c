"""The labels of the Secrets models name (the overflow key, the API keys file:
tenancy.SECRET_REFS), for the admin's policy.

Only when the policy asks for a label on them (`policy.secretLabel`), and only
the Secrets LocalModels name: each
is read by GET as metadata only (`PartialObjectMetadata`: the Secret's data
never reaches the operator), at most once per `MAX_AGE_SECONDS`. Secrets are
not watched: a watch would list every Secret's data in the watched namespaces.
A Secret that is missing (404) or that the operator may not read (403) has no
labels, so the policy refuses the model naming it; after any other failure the
last labels read are kept. The reconciler wakes again after `MAX_AGE_SECONDS`
while a model waits for a label (tenancy's refusals).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import changed_keys
from localmodel.controller.writer import Kube, KubeError
from localmodel.tenancy import TenantPolicy, needs_secrets

log = logging.getLogger("localmodel.secrets")

MAX_AGE_SECONDS = 30.0
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
MAX_LABELS = 256  # a Secret's labels kept (an object may carry more; none needs them)

Key = tuple[str, str]  # (namespace, name)


class SecretLabels:
    """What the last reads found: (namespace, name) -> labels (absent: none found)."""

    def __init__(self, kube: Kube, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._read: dict[Key, tuple[float, Mapping[str, str] | None]] = {}

    async def labels(self, wanted: Iterable[Key]) -> dict[Key, Mapping[str, str]]:
        """The labels of each wanted Secret, read again when older than the bound."""
        wanted = set(wanted)
        now = self.clock()
        stale = [k for k in wanted if k not in self._read
                 or now - self._read[k][0] >= MAX_AGE_SECONDS]
        await asyncio.gather(*(self._read_one(k, now) for k in stale))
        self._read = {k: v for k, v in self._read.items() if k in wanted}
        return {k: v[1] for k, v in self._read.items() if v[1] is not None}

    async def _read_one(self, key: Key, now: float) -> None:
        namespace, name = key
        try:
            body = await self.kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}",
                                       accept=METADATA_ONLY)
        except KubeError as exc:
            if exc.status in (403, 404):
                if exc.status == 403:
                    log.warning("Secret %s/%s: may not be read (RBAC): the policy's label "
                                "cannot be checked", namespace, name)
                self._read[key] = (now, None)
            else:
                log.warning("Secret %s/%s: not read: %s", namespace, name, exc)
            return
        except (TimeoutError, OSError) as exc:
            log.warning("Secret %s/%s: not read: %s", namespace, name, exc)
            return
        meta = body.get("metadata") if isinstance(body, dict) else None
        labels = meta.get("labels") if isinstance(meta, dict) else None
        self._read[key] = (now, {str(k): str(v) for k, v in list(labels.items())[:MAX_LABELS]}
                           if isinstance(labels, dict) else {})


class NamedSecrets:
    """The Secrets the valid models name that the admin's policy must see
    (`tenancy.needs_secrets`): the same set while the models section is the
    same object, and worked out again only for the models whose object changed."""

    def __init__(self) -> None:
        self._wanted: tuple[object, set[Key]] = (None, set())
        self._needs: dict[str, tuple[Key, ...]] = {}  # model -> Secrets it names

    def of(self, models: dict[str, ModelObject], tenants: TenantPolicy) -> set[Key]:
        if self._wanted[0] is not models:  # (the same models: the same Secrets)
            needs = self._needs
            changed = (None if not isinstance(self._wanted[0], dict)
                       else changed_keys(self._wanted[0], models))
            if changed is None:
                needs.clear()
            for m in (models.values() if changed is None else map(models.get, changed)):
                if m is not None and m.model is not None and (
                        k := needs_secrets(m.model, tenants)):
                    needs[m.key] = k
                elif changed is not None and m is not None:
                    needs.pop(m.key, None)
            self._wanted = (models, {k for ks in needs.values() for k in ks})
        return self._wanted[1]
