"""The operator's only writes to the cluster: a small async client (aiohttp).

Server-side apply with one field manager (`localmodel-operator`) for
ConfigMaps, Services, claims and status; plain creates for pods (and for the
first write of anything, so an object of the same name that the operator did
not create is never taken over); deletes with a uid precondition; Events.
Credentials come from `localmodel.kube.credentials` (a kubeconfig or the
in-cluster service account); the same `Credentials` log kopf in, so reads and
writes use one identity.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from localmodel import API_VERSION, PLURAL, __version__
from localmodel.contract import FIELD_MANAGER, OPERATOR
from localmodel.kube import Credentials

_PATHS = {
    "Pod": ("/api/v1", "pods"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),  # the router's signing key only (controller/signing.py)
    "Service": ("/api/v1", "services"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Event": ("/api/v1", "events"),
    "LocalModel": (f"/apis/{API_VERSION}", PLURAL),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
}


class KubeError(Exception):
    """An API request the server refused: its HTTP code, and the reasons of the
    Status body's `details.causes` (what `policy.refusal` reads, never the text)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, Mapping) else str(body)[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body
        details = body.get("details") if isinstance(body, Mapping) else None
        causes = details.get("causes") if isinstance(details, Mapping) else None
        self.causes = frozenset(
            str(c["reason"]) for c in causes or [] if isinstance(c, Mapping) and c.get("reason"))


class NotLeading(Exception):
    """A write the client refused to send: its fence (`Kube(fence=...)`) said
    this replica does not hold the leader Lease now."""


def collection_path(kind: str, namespace: str) -> str:
    prefix, plural = _PATHS[kind]
    return f"{prefix}/namespaces/{quote(namespace)}/{plural}"


def object_path(kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(kind, namespace)}/{quote(name)}"


WriteHook = Callable[[str, str, int], None]  # (verb, kind, HTTP status)


class Kube:
    """One aiohttp session; every write is counted through `on_write`. With a
    `fence`, every write asks it first, just before it is sent, and is refused
    (`NotLeading`, nothing sent) when it says no: the leader Lease's
    `LeaderElector.holds`, which a pass that held the event loop while the
    Lease was lost would otherwise learn of only once the loop caught up."""

    def __init__(self, creds: Credentials, on_write: WriteHook | None = None,
                 concurrency: int = 16, identity: str = "",
                 fence: Callable[[], bool] | None = None) -> None:
        self.creds = creds
        self.fence = fence
        # The audit log names the user, not the replica: the user agent does.
        self.user_agent = f"{OPERATOR}/{__version__}" + (
            f" ({identity})" if identity else "")
        self.on_write = on_write
        self._limit = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.creds.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.creds.ca_file)
        if self.creds.cert_file and self.creds.key_file:
            ctx.load_cert_chain(self.creds.cert_file, self.creds.key_file)
        return ctx

    async def __aenter__(self) -> Kube:
        connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=self._limit)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=30)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        kind: str = "",
        accept: str = "application/json",
    ) -> Any:
        assert self._session is not None, "use `async with Kube(...)`"
        if method != "GET" and self.fence is not None and not self.fence():
            raise NotLeading(f"{method} {path}: not sent: this replica does not hold "
                             "the leader Lease")
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        token = self.creds.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        async with self._session.request(
            method, self.creds.server + path, data=data, headers=headers, params=params
        ) as resp:
            raw = await resp.read()
            status = resp.status
        if method != "GET" and self.on_write is not None:
            self.on_write(method.lower(), kind, status)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if status >= 400:
            raise KubeError(method, path, status, parsed)
        return parsed

    async def get(self, path: str, accept: str = "application/json") -> Any:
        """`accept`: e.g. PartialObjectMetadata, for an object's metadata only."""
        return await self.request("GET", path, accept=accept)

    async def create(self, manifest: Mapping[str, Any]) -> Any:
        kind = str(manifest["kind"])
        ns = str(manifest["metadata"]["namespace"])
        return await self.request("POST", collection_path(kind, ns), manifest, kind=kind,
                                  params={"fieldManager": FIELD_MANAGER})

    async def apply(self, manifest: Mapping[str, Any], subresource: str = "") -> Any:
        """Server-side apply (JSON is YAML) with the operator's field manager."""
        kind = str(manifest["kind"])
        meta = manifest["metadata"]
        path = object_path(kind, str(meta["namespace"]), str(meta["name"]))
        if subresource:
            path += "/" + subresource
        return await self.request(
            "PATCH", path, manifest, content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            kind=kind + (f"/{subresource}" if subresource else ""),
        )

    async def delete(self, kind: str, namespace: str, name: str, uid: str = "",
                     force: bool = False) -> Any:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if force:
            body["gracePeriodSeconds"] = 0
        return await self.request("DELETE", object_path(kind, namespace, name), body, kind=kind)
