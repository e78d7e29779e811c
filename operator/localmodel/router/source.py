"""The cluster's replicas: the hook `localmodel router` calls without
--replicas (router/follow.py watches, router/cluster.py reads). Flags:
--namespaces (default: every namespace) and --kubeconfig (default: KUBECONFIG,
else the pod's service account, as for every command that talks to a cluster).
"""

from __future__ import annotations

import argparse

from localmodel.router.table import ReplicaSource

MAX_NAMESPACES = 100  # one pair of watches each
# How long `cluster_source` waits for its first lists, so a new router replica
# listens (and turns Ready) knowing the models, not answering "not served"
# meanwhile; past it, it starts anyway and the watches keep trying (logged).
FIRST_LIST_SECONDS = 30.0


class SourceUnavailable(RuntimeError):
    """No source of replicas can be made from the flags given."""


def namespaces(value: str) -> tuple[str, ...]:
    """--namespaces NS,...: each a namespace's name, at most MAX_NAMESPACES."""
    import re

    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if len(names) > MAX_NAMESPACES:
        raise argparse.ArgumentTypeError(
            f"{len(names)} namespaces, over the limit of {MAX_NAMESPACES}")
    for name in names:
        if len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
            raise argparse.ArgumentTypeError(f"{name!r} is not a namespace's name")
    return names


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags the cluster source reads."""
    parser.add_argument(
        "--namespaces", type=namespaces, default=(), metavar="NS,...",
        help="serve the LocalModels of these namespaces (default: every namespace)")
    parser.add_argument(
        "--kubeconfig", default=None, metavar="PATH",
        help="the cluster's kubeconfig (default: KUBECONFIG, else the pod's service account)")


def cluster_source(args: argparse.Namespace) -> ReplicaSource:
    """The replicas the cluster has Ready, kept current by watches it starts."""
    from localmodel.kube import KubeconfigError, api_client
    from localmodel.router.follow import ClusterSource, log

    try:
        client = api_client(getattr(args, "kubeconfig", None))
    except KubeconfigError as exc:
        raise SourceUnavailable(f"the cluster's replicas: {exc}") from exc
    source = ClusterSource(client, getattr(args, "namespaces", ()) or ()).start()
    if not source.wait_synced(FIRST_LIST_SECONDS):
        log.warning("the cluster's models are not listed after %.0f s; serving anyway, "
                    "the watches keep trying", FIRST_LIST_SECONDS)
    return source
