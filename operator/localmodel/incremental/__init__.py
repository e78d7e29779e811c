"""The incremental layer: the plain path (`localmodel.desired.desired_state`)
made to cost what changed, for the operator. Each module is one memo layer (or
what one reads), named for what it keeps:

``desired``: `Desired`, each model's result kept between passes;
``roster``: `Roster`, the model list and each spec's preparation and demand;
``rereads``: `Rereads`, which models' reads changed since the last pass;
``evaluations``: `Evaluations`, the rules memoized by value within a pass;
``pod_parts``: `PodParts`, a pod's containers and their text shared within a pass;
``applied_digests``: `AppliedDigests`, the applied objects' digests from shared templates;
``templates``: `TextTemplate`, sorted JSON text put together around what varies;
``keys``: what every memo of a pass keys a spec and a node on.

The planner's own long-lived form, `planner.Planner`, stays with the planner
(it is the plain `plan()` too: see its docstring). Property tests hold each
equal to the plain path (tests/controller/test_incremental_desired.py,
test_incremental_plan.py, test_pass_memo.py).
"""

from localmodel.incremental.applied_digests import AppliedDigests
from localmodel.incremental.desired import Desired
from localmodel.incremental.evaluations import Evaluations
from localmodel.incremental.keys import node_key, spec_key
from localmodel.incremental.pod_parts import (
    PodParts,
    affinity_text,
    pod_digest,
    pod_spec_hash,
    volumes_text,
)

__all__ = [
    "AppliedDigests",
    "Desired",
    "Evaluations",
    "PodParts",
    "affinity_text",
    "node_key",
    "pod_digest",
    "pod_spec_hash",
    "spec_key",
    "volumes_text",
]
