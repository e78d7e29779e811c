"""Node facts: the CPU budget and CPU features of a node."""

from localmodel.facts.model import FactSource, NodeFacts, Taint

__all__ = ["FactSource", "NodeFacts", "Taint"]
