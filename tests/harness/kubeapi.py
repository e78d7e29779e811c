"""A small typed REST client for one identity of the test cluster.

The tests need status codes (403 for an RBAC denial, 422 for a CEL rejection)
and raw JSON, which a plain HTTPS client shows more directly than the
generated Python client.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

JSON = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: JSON) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path} -> {status}: {body.get('message', body)}")

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


class KubeApi:
    """Requests against the API server as one bearer-token identity."""

    def __init__(self, server: str, token: str, ca_file: Path | None) -> None:
        self.server = server.rstrip("/")
        self.token = token
        if ca_file is None:
            self._ssl = ssl._create_unverified_context()
        else:
            self._ssl = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, JSON]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())

    def _checked(self, method: str, path: str, body: Any = None, **kw: Any) -> JSON:
        status, payload = self.request(method, path, body, **kw)
        if status >= 400:
            raise ApiError(method, path, status, payload)
        return payload

    def get(self, path: str) -> JSON:
        return self._checked("GET", path)

    def create(self, path: str, body: JSON) -> JSON:
        return self._checked("POST", path, body)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self._checked("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self._checked("DELETE", path, body)

    def status_of(self, method: str, path: str, body: Any = None) -> int:
        """Just the status code, for checks like 'is this identity allowed'."""
        return self.request(method, path, body)[0]


def _decode(raw: bytes) -> JSON:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"items": value}
