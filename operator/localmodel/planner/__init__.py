"""Placement planner: which node runs each replica of each model.

Pure: ``plan(models, nodes, current, usage) -> Plan``. No clock, no environment,
no Kubernetes client; the same inputs, in any order, give the same plan.

Rules
-----
* A replica needs ``cpu`` whole CPUs (a `CpuRequest`; "node": every free
  whole CPU of the chosen node, at least one) and ``memory_bytes``. Both must fit
  the node's allocatable resources minus ``usage`` (other pods' requests) minus
  what this plan already put there. Nothing is ever over-committed.
* The planner decides each replica's CPUs (`Cpus`, where it takes its node):
  the whole CPUs it reserves, and the engine's count (threads and CPU limit),
  that lowered to what a process there may run on (allocatable CPUs, cpuset,
  CPU quota). The rules read that count; they never decide it.
* An exclusive model never shares a node with any other of our models; a
  non-exclusive one may share with other non-exclusive ones. Replicas of one
  model are always on different nodes.
* Unschedulable nodes, nodes that miss a ``node_selector`` label and nodes with an
  untolerated ``NoSchedule``/``NoExecute`` taint are rejected. An untolerated
  ``PreferNoSchedule`` taint is only a penalty: such a node is used only when no
  node without the penalty fits.

Algorithm
---------
1. **Keep.** Models are processed in a fixed order: demands with a fixed CPU
   count first, then ``cpu: node`` demands (they take whatever CPU is left on a
   node, so they must come after everything else that shares it), each group by
   model key, then replica. Every existing placement (``current``) whose node
   still exists, is still eligible and still fits is kept, in that order.
2. **Place.** The remaining replicas, in the same order, are placed greedily on
   the best node (tie-break below). Nodes are indexed, not scanned. A *view* is
   the set of nodes one node selector matches (one view for "no selector", one
   per distinct broad selector); within a view, nodes with the same taints form
   a *taint class*, which keeps its usable nodes in two sorted fit lists of
   ``(whole CPUs free for the engine, free memory, name)``: nodes without our
   models, and nodes shared by non-exclusive models (a node held by an exclusive
   model leaves the index). A query bisects to the first entry with enough CPU,
   skips a CPU bucket's too-small-memory entries by bisecting again, and
   compares the few classes whose taints the demand tolerates. A selector that
   matches few nodes (a hostname, say) searches those nodes directly instead.
   The fit lists are chunked so an update costs about sqrt(n), and there is
   one pair of lists per distinct sidecar CPU overhead (usually one or two).
   Cost: about ``O(nodes * views + models * classes * log(nodes))``.
3. **Explain.** Each replica that fits nowhere is explained against the final
   state (it did not fit earlier either: capacity only shrinks while planning, so
   the explanation is true and identical when the plan is re-planned). Small
   clusters list every node; large ones are summarised by counting over sorted
   entries (a census), with a bounded sample of rejected nodes.

Tie-break
---------
For a fixed CPU count: **best fit** — the node with the fewest free whole CPUs
that still fit, then the least free memory, then the node name. For CPU inference
the engine gets exactly ``cpu`` threads, so spare cores on the chosen node are
wasted for it; packing keeps the large nodes whole for the large models (and for
``cpu: node`` models) instead of nibbling every node, and exclusive models
(the default) waste least when they take the smallest node that fits.
For ``cpu: node``: the node with the **most** free whole CPUs (the user asked
for a machine; more cores mean more threads), then the least free memory, then
the name. Before all that, fewer untolerated ``PreferNoSchedule`` taints win.

Stability: kept placements never move; a new model never moves an existing one.
Re-planning a plan's own output as ``current`` returns an equal plan (the kept
order puts ``cpu: node`` demands last, so they get the same CPU count again).

Modules
-------
``model``: inputs, outputs and ``PlannerSettings``; ``fit``: the sorted fit
lists and their two queries; ``index``: the node index, eligibility and the one
definition of "fits"; ``place``: keep, then place (``Planner``, the same pass
kept between calls); ``inputs``: a call's inputs and what of them is the last
call's; ``keeping``: what keeping did on each node, kept between calls;
``assign``: the best node for one replica, taking it; ``explain``: why a
replica fits nowhere, over a ``census`` in large clusters; ``removal``:
whether a replica fits on one node once one model left it (a yield's
question, no second plan); ``text``: how quantities are worded.

Preference
----------
A replica may prefer a node (``ModelDemand.prefer``: a sleeper's home, where
its claim is, or a node yielded to it). When it is placed, the preferred node
wins among the nodes that fit with the fewest untolerated ``PreferNoSchedule``
taints, before best fit. It only places: a kept replica never moves to its
preferred node, and nothing is evicted for it.
"""

from localmodel.planner.cpus import CpuRequest, Cpus, cpu_limit, replica_cpus
from localmodel.planner.index import tolerates
from localmodel.planner.model import (
    DEFAULT_SETTINGS,
    Assignment,
    ModelDemand,
    Plan,
    PlannerSettings,
    Unplaced,
    UnplacedReason,
    Usage,
)
from localmodel.planner.place import Planner, plan
from localmodel.planner.removal import fits_after_removal, rejection_after_removal

__all__ = [
    "DEFAULT_SETTINGS",
    "Assignment",
    "CpuRequest",
    "Cpus",
    "ModelDemand",
    "Plan",
    "Planner",
    "PlannerSettings",
    "Unplaced",
    "UnplacedReason",
    "Usage",
    "cpu_limit",
    "fits_after_removal",
    "plan",
    "rejection_after_removal",
    "replica_cpus",
    "tolerates",
]
