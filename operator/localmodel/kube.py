"""Kubernetes API clients for the commands that talk to a cluster (run, probe --node, doctor).

Configuration as for `localmodel run`: ``--kubeconfig PATH``, else the
``KUBECONFIG`` environment variable, else the in-cluster service account.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Credentials", "KubeconfigError", "api_client", "credentials", "kubeconfig_namespace"]


class KubeconfigError(Exception):
    """No usable cluster configuration; the message says which one was tried."""


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` for the configured cluster (`context`: a
    kubeconfig context other than the current one)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if context and not path:
        raise KubeconfigError(
            f"--context {context}: no kubeconfig (no --kubeconfig, no KUBECONFIG)")
    try:
        if path:
            # KUBECONFIG may list several files; the client reads the first.
            first = path.split(os.pathsep)[0]
            return config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=first, context=context or None)
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        where = (
            f"kubeconfig {path}"
            if path
            else "in-cluster configuration (no --kubeconfig, no KUBECONFIG)"
        )
        raise KubeconfigError(f"{where}: {e}") from e


def kubeconfig_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, else `default` (in-cluster:
    the pod's own namespace)."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if not path:
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    try:
        contexts, current = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path.split(os.pathsep)[0])
    except (ConfigException, OSError, TypeError, ValueError) as e:
        raise KubeconfigError(f"kubeconfig {path}: {e}") from e
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    if chosen is None:
        raise KubeconfigError(f"kubeconfig {path}: no context {context!r}")
    return str((chosen.get("context") or {}).get("namespace") or "default")


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate, as plain values, for the
    clients that are not the official one (the operator's aiohttp writer, kopf's
    login). Read by the official client's loaders, so every command understands
    the same kubeconfigs (contexts, inline data, exec plugins)."""

    server: str
    ca_file: str | None = None
    insecure: bool = False
    token: str | None = None
    # In-cluster service-account tokens rotate: read the file on every request.
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def bearer(self) -> str | None:
        if self.token_file:
            with open(self.token_file) as f:
                return f.read().strip()
        return self.token


_SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def credentials(kubeconfig: str | None = None) -> Credentials:
    """Credentials from --kubeconfig, else KUBECONFIG, else in-cluster."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    configuration = client.Configuration()
    try:
        if path:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path.split(os.pathsep)[0], client_configuration=configuration)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        where = (f"kubeconfig {path}" if path
                 else "in-cluster configuration (no --kubeconfig, no KUBECONFIG)")
        raise KubeconfigError(f"{where}: {e}") from e
    # The client keeps the header value under "authorization" or "BearerToken"
    # (depending on the loader), with or without its "Bearer " prefix.
    keys = configuration.api_key or {}
    auth = str(keys.get("authorization") or keys.get("BearerToken") or "")
    token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else (auth or None)
    return Credentials(
        server=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        token=None if not path else token,
        token_file=None if path else _SA_TOKEN,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
    )
