"""`localmodel doctor`: the field's debugging order as a command.

Against a cluster (`cluster`) or one machine (`local`), in this order: models
holding weights per node, callers that can queue, cancellation, and only then
speed. Each finding has a verdict (ok, warn, fail), what was seen, and the fix
(`report`). The checks are pure functions over what was read; reading is done
by the `gather_*` functions.
"""

from localmodel.doctor.report import Finding, Report, Verdict

__all__ = ["Finding", "Report", "Verdict"]
