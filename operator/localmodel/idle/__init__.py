"""Pure: when an idle model sleeps, what wakes it, and who gives a node to a
waking model, never a busy one (issue 44; design in docs/idle.md).

``asks``: what the shell gathers and the closes it sends; ``schedule``: awake
windows, `now` passed in; ``state``: the idle states and their moves,
`due_to_sleep`; ``yielding``: `choose_yield`. The operator builds their inputs
(`IdlePolicy` from `spec.idle`, `Reading` from each replica's `/speed`
activity) and does what they decide.
"""

from localmodel.idle.schedule import (
    DAYS,
    Window,
    is_awake_window,
    next_window_start,
    window_end,
)
from localmodel.idle.state import (
    AWAKE,
    Event,
    IdlePolicy,
    Phase,
    Reading,
    Release,
    State,
    advance,
    due_to_sleep,
    quiet_for,
)
from localmodel.idle.yielding import (
    Candidate,
    Waker,
    YieldAsk,
    choose_yield,
    choose_yields,
    may_yield,
)

__all__ = [
    "AWAKE",
    "DAYS",
    "Candidate",
    "Event",
    "IdlePolicy",
    "Phase",
    "Reading",
    "Release",
    "State",
    "Waker",
    "Window",
    "YieldAsk",
    "advance",
    "choose_yield",
    "choose_yields",
    "due_to_sleep",
    "is_awake_window",
    "may_yield",
    "next_window_start",
    "quiet_for",
    "window_end",
]
