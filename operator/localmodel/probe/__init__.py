"""The node probe: reads this machine's CPU facts and turns them into node labels."""

from localmodel.probe.labels import probe_labels

__all__ = ["probe_labels"]
