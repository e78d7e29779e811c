"""Node facts: the CPU budget and CPU features of a node.

- `model`: `NodeFacts`, `Taint`, `FactSource` (pure data);
- `node`: `from_node` / `from_node_list` from Kubernetes Node objects (NFD and
  probe labels);
- `machine`: `from_this_machine` (cgroups, cpuset, /proc/cpuinfo);
- `quantity`: exact Kubernetes quantities (`parse_cpu_milli`, `parse_bytes`,
  `format_bytes`);
- `flags`: CPU feature spelling and which features each source reports.
"""

from localmodel.facts.model import FactSource, NodeFacts, Taint
from localmodel.facts.node import NodeFactsError, from_node, from_node_list

__all__ = ["FactSource", "NodeFacts", "NodeFactsError", "Taint", "from_node", "from_node_list"]
