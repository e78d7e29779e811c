"""Where one turn of a session goes: its owner, unless waiting there costs
clearly more than re-reading the history elsewhere. Pure.

For each replica the router knows (router/replicas.py):
- its wait for a slot: requests ahead of this one (what its /slots said, or
  what this router has in flight there, whichever is more) beyond its free
  slots, times its mean seconds per request (its /speed totals), the running
  one counted half done, spread over its slots. Unknown (no answer yet, or
  a bad one): the owner keeps the turn.
- its prefill speed (/speed: real traffic's once it read enough, else the
  calibration's).
And for the session, the tokens each replica holds of it (the last answer's
prompt accounting there: prompt plus generated tokens).

The re-read cost at another replica is the session's history it does not
hold, at its prefill speed: (history - held there) / tokens per second; the
history is what the last answer said, or this request's prompt (estimated
from its text, `session.prompt_tokens`) when that is longer. The
turn spills to the replica with the lowest wait + re-read only when the
owner's wait exceeds that by a clear margin: more than `SPILL_FACTOR` times
it plus `SPILL_MARGIN_S`. A spill is paid for twice (the history read
elsewhere now, and the turns the owner then lacks read there when the
session comes back), and both estimates are rough (a mean request's
seconds, the running one guessed half done), so a near thing stays home.
Both estimates are recorded with the decision (`Decision.header`, the
access log, the metrics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OWNER = "owner"
RUNNING_LEFT = 0.5  # of a running request's mean duration, expected still to come
SPILLED = "spilled"
SPILL_FACTOR = 2.0  # the owner's wait must exceed twice the other's wait + re-read...
SPILL_MARGIN_S = 1.0  # ...plus this, for a turn to leave its owner


@dataclass(frozen=True)
class ReplicaState:
    """What the router knows of a replica when it decides: its wait for a slot and its prefill
    speed."""

    wait_s: float | None  # estimated wait for a slot now; None: not known
    prefill_tps: float | None  # prompt tokens read per second; None: not measured


@dataclass(frozen=True)
class Decision:
    """Where a session turn goes: its owner or another replica (spilled), and the numbers that
    decided it."""

    replica: str
    owner: str
    owner_wait_s: float | None
    reread_s: float | None  # the re-read the chosen replica costs (spilled) or the best other's
    other_wait_s: float | None = None  # the wait at the replica compared with the owner

    @property
    def kind(self) -> str:
        return OWNER if self.replica == self.owner else SPILLED

    @property
    def header(self) -> str:
        """The X-LocalModel-Route value: `owner` or `spilled; owner_wait_s=..; reread_s=..`."""
        if self.kind == OWNER:
            return OWNER
        return (f"{SPILLED}; owner_wait_s={_s(self.owner_wait_s)}; "
                f"reread_s={_s(self.reread_s)}; wait_s={_s(self.other_wait_s)}")


def _s(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}"


def wait_seconds(total: int, occupied: int, mean_request_s: float | None) -> float | None:
    """Seconds until a slot frees for one more request: none while a slot is
    free; else the queued requests ahead, each its mean duration, plus the
    rest of the running one whose slot ends first (on average half done: the
    router does not know when each started), spread over the slots."""
    if occupied < total:
        return 0.0
    if mean_request_s is None:
        return None
    return (occupied - total + RUNNING_LEFT) * mean_request_s / total


def reread_seconds(history: int, held: int, prefill_tps: float | None) -> float | None:
    missing = max(0, history - held)
    if missing == 0:
        return 0.0
    if not prefill_tps:
        return None
    return missing / prefill_tps


def decide(
    order: Sequence[str],
    states: Mapping[str, ReplicaState],
    held: Mapping[str, int],
    prompt_tokens: int = 0,
    factor: float = SPILL_FACTOR,
    margin_s: float = SPILL_MARGIN_S,
) -> Decision:
    """`order`: the session's rendezvous ranking (owner first); `states`: what
    is known of each replica; `held`: the session's tokens each replica holds;
    `prompt_tokens`: this request's prompt, estimated (a turn spilled from its
    owner is read there again when the session comes back, so a session the
    router has not seen yet is not free to move either); `factor` and
    `margin_s`: how much longer the owner's wait must be than the cost
    elsewhere (module docstring)."""
    owner = order[0]
    owner_state = states.get(owner)
    owner_wait = owner_state.wait_s if owner_state is not None else None
    history = max(max(held.values(), default=0), prompt_tokens)
    best: tuple[float, str, float, float] | None = None  # (cost, name, wait, reread)
    for name in order[1:]:
        state = states.get(name)
        if state is None or state.wait_s is None:
            continue
        reread = reread_seconds(history, held.get(name, 0), state.prefill_tps)
        if reread is None:
            continue
        cost = state.wait_s + reread
        if best is None or cost < best[0]:
            best = (cost, name, state.wait_s, reread)
    if owner_wait is None or best is None or not owner_wait > factor * best[0] + margin_s:
        return Decision(owner, owner, owner_wait,
                        None if best is None else best[3], None if best is None else best[2])
    return Decision(best[1], owner, owner_wait, best[3], best[2])
