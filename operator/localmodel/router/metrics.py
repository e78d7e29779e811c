"""The router's metrics (GET /metrics on its admin port), Prometheus text."""

from __future__ import annotations

from collections.abc import Callable

from localmodel.metrics import Counter, Gauge, Histogram, render

PREFIX = "localmodel_router_"
# Seconds a request was held for its model to wake (router/holding.py): a
# wake takes seconds to minutes; the hold ends by 3600 s at the latest.
HELD_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class RouterMetrics:
    """Keeps the router's metrics: decisions, turns per replica, requests, upstream errors and
    reads."""

    def __init__(self, reads: Counter, sessions: Callable[[], int],
                 owned: Callable[[], int] = lambda: 0,
                 key_checks: Counter | None = None,
                 admission: Callable[[], dict[str, int]] = dict,
                 held: Callable[[], dict[tuple[str, ...], float]] = dict) -> None:
        self.decisions = Counter(PREFIX + "decisions_total",
                                 "routing decisions of session turns: owner or spilled",
                                 ("decision",))
        self.replica_turns = Counter(PREFIX + "replica_turns_total",
                                     "session turns sent to each replica (namespace and pod), "
                                     "by decision", ("namespace", "pod", "decision"))
        self.requests = Counter(PREFIX + "requests_total",
                                "requests answered, by route and status", ("route", "status"))
        self.upstream_errors = Counter(PREFIX + "upstream_errors_total",
                                       "exchanges with a replica that failed, by reason",
                                       ("reason",))
        self.spilled_reread = Counter(PREFIX + "spilled_reread_seconds_total",
                                      "estimated re-read seconds the spilled turns cost")
        self.spilled_owner_wait = Counter(PREFIX + "spilled_owner_wait_seconds_total",
                                          "estimated seconds the spilled turns would have "
                                          "waited at their owner")
        self.sessions = Gauge(PREFIX + "sessions", "sessions whose cached tokens are remembered",
                              lambda: {(): float(sessions())})
        self.owned = Gauge(PREFIX + "owned_sessions",
                           "live sessions with a remembered owner (bounded loads)",
                           lambda: {(): float(owned())})
        self.reads = reads
        self.key_checks = key_checks  # router/keyed.py's, by answer
        self.admission = Gauge(PREFIX + "admission",
                               "places held by requests in progress (--places), bodies being "
                               "read and parsed (--body-reads), and bodies waiting their turn",
                               lambda: {(k,): float(v) for k, v in admission().items()},
                               ("what",))

        self.held = Gauge(PREFIX + "held",
                          "requests held for a sleeping model to wake, per LocalModel",
                          held, ("namespace", "localmodel"))
        self.held_total = Counter(PREFIX + "held_total",
                                  "held requests by how their hold ended: relayed, expired "
                                  "(deadline), left (the caller), full (refused: "
                                  "--hold-per-model)", ("result",))
        self.held_seconds = Histogram(PREFIX + "held_seconds",
                                      "seconds a request was held for its model to wake",
                                      HELD_BUCKETS)

    def render(self) -> str:
        extra = [] if self.key_checks is None else [self.key_checks]
        return render([self.decisions, self.replica_turns, self.requests, self.upstream_errors,
                       self.spilled_reread, self.spilled_owner_wait, self.sessions, self.owned,
                       self.reads, self.admission, self.held, self.held_total,
                       self.held_seconds, *extra])
