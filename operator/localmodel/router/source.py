"""The cluster's replicas: the hook `localmodel router` calls without
--replicas. The cluster side (discovery from LocalModels and their
EndpointSlices or pods) fills `cluster_source`; `add_cluster_flags` declares
the flags it reads. Until then, it says so.
"""

from __future__ import annotations

import argparse

from localmodel.router.table import ReplicaSource


class SourceUnavailable(RuntimeError):
    """No source of replicas can be made from the flags given."""


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags the cluster source reads (none yet)."""


def cluster_source(args: argparse.Namespace) -> ReplicaSource:
    """The replicas the cluster has Ready, kept current; not available yet."""
    raise SourceUnavailable(
        "reading replicas from the cluster is not available in this build: "
        "give --replicas MODEL=URL[,URL...]"
    )
