"""Kubernetes API clients for the commands that talk to a cluster (probe --node, doctor).

Configuration as for `localmodel run`: ``--kubeconfig PATH``, else the
``KUBECONFIG`` environment variable, else the in-cluster service account.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["KubeconfigError", "api_client"]


class KubeconfigError(Exception):
    """No usable cluster configuration; the message says which one was tried."""


def api_client(kubeconfig: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` for the configured cluster."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        if path:
            # KUBECONFIG may list several files; the client reads the first.
            first = path.split(os.pathsep)[0]
            return config.new_client_from_config(config_file=first)  # type: ignore[no-untyped-call]
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
