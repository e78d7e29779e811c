"""What the router tells of each request's end (`Told`): its counts in the
router's metrics and one access-log line, JSON, on stdout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from localmodel.gateway_contract.replies import error_response
from localmodel.router.decide import Decision
from localmodel.router.holding import Refused
from localmodel.router.metrics import RouterMetrics
from localmodel.router.proxy import Relayed
from localmodel.router.table import ModelRoute


class Told:
    """Decides what each request's end tells: the metrics it counts in (by
    path and status; a session's decision, a spill's cost, an upstream
    failure) and its access-log line (path, status, duration, model,
    replica, session, decision, error)."""

    def __init__(self, metrics: RouterMetrics, log: Callable[[str], None],
                 clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.log = log
        self._clock = clock

    def refused(self, request: web.Request, started: float, status: int, message: str,
                openai: bool, headers: dict[str, str] | None = None) -> web.Response:
        """A request answered by the router itself, and that answer."""
        self.metrics.requests.inc(1, (request.path, str(status)))
        self.access(request, started, status, error=message)
        response = error_response(status, message, headers, openai=openai)
        if status in (413, 503):  # a body may be left unread: the connection goes with it
            response.force_close()
        return response

    def unheld(self, request: web.Request, started: float, model: str, refused: Refused,
               openai: bool) -> web.Response:
        """A request for a model with no Ready replica, answered at once (router/holding.py
        `refusal`: it does not sleep, is off, or asks for keys)."""
        self.metrics.requests.inc(1, (request.path, str(refused.status)))
        self.access(request, started, refused.status, model=model, error=refused.message)
        return error_response(refused.status, refused.message, refused.headers, openai=openai)

    def gone(self, request: web.Request, route: ModelRoute, key: str | None,
             decision: Decision, started: float) -> None:
        """A caller that left while its request was relayed."""
        if key is not None:
            self.metrics.decisions.inc(1, (decision.kind,))
        self.metrics.requests.inc(1, (request.path, "499"))
        self.access(request, started, 499, model=route.qualified, replica=decision.replica,
                    decision=decision if key else None, session=key, error="caller gone")

    def relayed(self, request: web.Request, route: ModelRoute, key: str | None,
                decision: Decision, done: Relayed, started: float) -> None:
        """A request relayed to its end."""
        if key is not None:
            self.metrics.decisions.inc(1, (decision.kind,))
            if decision.kind != "owner":
                self.metrics.spilled_reread.inc(decision.reread_s or 0.0)
                self.metrics.spilled_owner_wait.inc(decision.owner_wait_s or 0.0)
        if done.error:
            self.metrics.upstream_errors.inc(1, (done.error,))
        self.metrics.requests.inc(1, (request.path, str(done.status)))
        self.access(request, started, done.status, model=route.qualified,
                    replica=decision.replica, decision=decision if key else None,
                    session=key, error=done.error)

    def access(self, request: web.Request, started: float, status: int, *,
               model: str = "", replica: str = "", decision: Decision | None = None,
               session: str | None = None, error: str = "") -> None:
        """The access-log line."""
        doc: dict[str, Any] = {"time": round(time.time(), 3), "path": request.path,
                               "status": status, "duration_s": round(self._clock() - started, 4)}
        if model:
            doc["model"] = model
        if replica:
            doc["replica"] = replica
        if session:
            doc["session"] = session
        if decision is not None:
            doc.update(decision=decision.kind, owner=decision.owner,
                       owner_wait_s=_r(decision.owner_wait_s), reread_s=_r(decision.reread_s))
        if error:
            doc["error"] = error[:200]
        self.log(json.dumps(doc, separators=(",", ":")))


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
