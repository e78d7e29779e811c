"""Whether one more replica would fit on one node of a plan if one model left
it (`fits_after_removal`): the question a yield asks, answered on that node
alone with the index's one definition of "fits", never by a second plan."""

from __future__ import annotations

from collections.abc import Mapping

from localmodel.facts import NodeFacts
from localmodel.planner.assign import occupy
from localmodel.planner.cpus import CpuRequest
from localmodel.planner.index import NodeIndex
from localmodel.planner.model import DEFAULT_SETTINGS, ModelDemand, Plan, Usage


def rejection_after_removal(
    demand: ModelDemand,
    node: NodeFacts,
    plan: Plan,
    demands: Mapping[str, ModelDemand],
    removed: str,
    usage: Usage | None = None,
) -> str | None:
    """Why one more replica of ``demand`` would not fit on ``node`` once every
    replica of model ``removed`` left it, the plan's other replicas there (each
    with the CPUs the plan gave it) and other pods' ``usage`` staying; None
    when it would fit. ``demands`` are the plan's demands by model key (their
    exclusivity and sidecar overhead); an occupant with none counts as
    exclusive, so an unknown one never lets a node look free."""
    index = NodeIndex([demand], [node], {node.name: usage or Usage()}, DEFAULT_SETTINGS)
    here = index.nodes[node.name]
    for a in plan.on_node(node.name):
        if a.model == removed:
            continue
        d = demands.get(a.model) or ModelDemand(a.model, 1, CpuRequest(1), a.memory_bytes)
        occupy(here, d, a.replica, a.cpu.reserved)
    rejected = index.rejection(here, demand)
    return None if rejected is None else rejected[1]


def fits_after_removal(
    demand: ModelDemand,
    node: NodeFacts,
    plan: Plan,
    demands: Mapping[str, ModelDemand],
    removed: str,
    usage: Usage | None = None,
) -> bool:
    """Whether one more replica of ``demand`` fits on ``node`` once model
    ``removed`` left it (`rejection_after_removal` finds no reason)."""
    return rejection_after_removal(demand, node, plan, demands, removed, usage) is None
