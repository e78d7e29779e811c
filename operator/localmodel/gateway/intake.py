"""A request's intake, before it asks for a slot: who its API key proves it is
(`CallerKeys`), its body read in time and parsed (`BodyIntake`), and the early
answer a step raises instead of passing its result on (`Answered`, `answer`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from localmodel.gateway.keys import KeyRing
from localmodel.gateway.ledger import ANONYMOUS, Sessions, clean_name
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.record import Outcome, RequestRecord
from localmodel.gateway.rewrite import BadRequest, Prepared, metadata_model, prepare
from localmodel.gateway.routes import OPENAI_PATHS, Kind, Route
from localmodel.gateway.slots import Priority
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.bounds import TooLarge
from localmodel.gateway_contract.headers import MAX_SESSION_CHARS, SESSION_HEADER
from localmodel.gateway_contract.reads import BodyReads
from localmodel.gateway_contract.replies import error_response


class Answered(Exception):
    """A step answered the caller early; its outcome is in the record."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered by."""

    seconds: float  # as the caller or --deadline set it
    at: float  # on the event loop's clock


def answer(
    rec: RequestRecord,
    outcome: Outcome,
    status: int,
    detail: str,
    message: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answered:
    """Record the outcome; the answer to raise (message: what the caller
    reads, when it says more than the record's detail)."""
    rec.finish(outcome, status, detail)
    openai = rec.route in OPENAI_PATHS
    return Answered(error_response(status, message or detail, headers, openai=openai))


class CallerKeys:
    """Decides who a request's API key proves it is (--keys-file), and keeps
    each key's caller's requests in flight, bounded by its key's concurrency."""

    def __init__(self, keys: Callable[[], KeyRing]) -> None:
        self.keys = keys  # the ring now (it is reloaded)
        self._load: dict[str, int] = {}  # requests in flight per key's caller

    def authenticate(self, request: web.Request, rec: RequestRecord) -> None:
        """The request's key names its caller (no header can claim another)
        and bounds its priority and its requests at once; 401 without a valid
        key."""
        rec.caller, rec.session = ANONYMOUS, None  # claimed, not proven
        entry = self.keys().find(request.headers.get("Authorization"))
        if entry is None:
            raise answer(
                rec, Outcome.UNAUTHORIZED, 401, "a valid API key is required",
                "a valid API key is required (Authorization: Bearer <key>)",
                {"WWW-Authenticate": 'Bearer realm="localmodel"'},
            )
        rec.key, rec.caller = entry, entry.caller
        rec.session = clean_name(request.headers.get(SESSION_HEADER), MAX_SESSION_CHARS)
        rec.priority = entry.priority_for(Priority(rec.priority)).value
        if entry.concurrency is not None:
            load = self._load.get(entry.caller, 0)
            if load >= entry.concurrency:
                rec.key = None  # not counted: it never held a place
                raise answer(
                    rec, Outcome.CALLER_LIMIT, 429, "caller limit",
                    f"caller {entry.caller} has {load} request(s) in progress, "
                    "its key's concurrency limit",
                )
            self._load[entry.caller] = load + 1

    def release(self, rec: RequestRecord) -> None:
        """The request ended: its place in its caller's count is free."""
        if rec.key is not None and rec.key.concurrency is not None:
            left = self._load.get(rec.caller, 1) - 1
            if left > 0:
                self._load[rec.caller] = left
            else:
                self._load.pop(rec.caller, None)


class BodyIntake:
    """Reads a request's body within its deadline, with at most --body-reads
    others at once, and parses it (the pure rewrite; a session's turn told to
    `sessions`, the options rewritten counted)."""

    def __init__(
        self, config: GatewayConfig, sessions: Sessions | None, metrics: GatewayMetrics
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.metrics = metrics
        # Bodies read and parsed at once: what they cost adds up (see --body-reads).
        self._reads = BodyReads(config.body_reads)

    async def read(
        self, request: web.Request, route: Route, rec: RequestRecord, deadline: Deadline
    ) -> tuple[bytes, Prepared]:
        """The body, read and parsed with at most --body-reads others."""
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise self._too_large(rec)
        try:
            async with asyncio.timeout_at(deadline.at):
                await self._reads.acquire()
        except TimeoutError:
            message = f"deadline of {deadline.seconds:g}s passed while waiting to read the body"
            raise answer(rec, Outcome.CANCELLED_DEADLINE, 504, message) from None
        try:
            raw = await self._read_body(request, rec)
            return raw, self._prepare(route, raw, rec)
        finally:
            self._reads.release()

    def _too_large(self, rec: RequestRecord) -> Answered:
        limit = self.config.max_body_bytes
        message = f"request body is over the limit of {limit} bytes (--max-body-bytes)"
        return answer(rec, Outcome.TOO_LARGE, 413, message)

    async def _read_body(self, request: web.Request, rec: RequestRecord) -> bytes:
        try:
            async with asyncio.timeout(self.config.body_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large(rec) from None
        except TimeoutError:
            message = f"request body not received within {self.config.body_timeout:g}s"
            raise answer(rec, Outcome.BODY_TIMEOUT, 408, message) from None

    def _prepare(self, route: Route, raw: bytes, rec: RequestRecord) -> Prepared:
        if route.kind is Kind.PASSTHROUGH:
            try:
                model = metadata_model(raw, self.config) if route.reads_body else ""
            except BadRequest as exc:
                raise answer(rec, Outcome.BAD_REQUEST, 400, str(exc)) from None
            except TooLarge as exc:
                raise answer(rec, Outcome.TOO_LARGE, 413, str(exc)) from None
            prepared = Prepared(body=raw, caller_streams=False, model=model)
        else:
            sessions = self.sessions if rec.session is not None else None
            try:
                prepared = prepare(route, raw, self.config, want_prompt=sessions is not None)
            except BadRequest as exc:
                raise answer(rec, Outcome.BAD_REQUEST, 400, str(exc)) from None
            except TooLarge as exc:
                raise answer(rec, Outcome.TOO_LARGE, 413, str(exc)) from None
            for option in prepared.rewritten:
                self.metrics.options_rewritten.inc(1, (option,))
            if rec.caller == ANONYMOUS and rec.key is None:
                rec.caller = clean_name(prepared.user) or ANONYMOUS
            if sessions is not None and prepared.prompt is not None and rec.session is not None:
                turn, rec.turn = sessions.arrive((rec.caller, rec.session), prepared.prompt)
                rec.rewrite, rec.previous_tokens = turn.rewrite, turn.previous_tokens
        rec.model = prepared.model
        rec.caller_streams = prepared.caller_streams
        return prepared
