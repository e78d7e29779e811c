"""The incremental layer: the plain path (`localmodel.desired.desired_state`)
made to cost what changed, for the operator.

``desired``: `Desired`, the pass the operator keeps between passes;
``evaluations``: `Evaluations`, the rules memoized by value within a pass.
The planner's own long-lived form, `planner.Planner`, stays with the planner
(it is the plain `plan()` too: see its docstring). Property tests hold each
equal to the plain path (tests/controller/test_incremental_desired.py,
test_incremental_plan.py, test_pass_memo.py).
"""

from localmodel.incremental.desired import Desired
from localmodel.incremental.evaluations import Evaluations

__all__ = ["Desired", "Evaluations"]
