"""Where the minutes went: the gateway's per-request ledger. Pure.

The field report behind this product took a timeline pulled apart by hand to
see why one question took 223 minutes: abandoned background work held the
slot, two compactions forced the whole history to be read again, and only then
came the model's own speed. The gateway sees all of it, so it keeps a record of
every request (`LedgerEntry`, its format in localmodel.gateway_contract)
with two facts nobody else reports:

- **waited behind**: while a request waits for a slot, every second of its wait
  is split evenly among the requests holding the slots (`WaitBook`), so the
  record names the callers (and their priority) it waited for;
- **re-read**: when a session's prompt does not extend its previous prompt (a
  compaction, a rewritten history, a changed system prompt), the engine cannot
  reuse its cache; the prefill of tokens the session had already read once is
  re-read time (`reread`).

Who is asking comes from `X-LocalModel-Caller` and `X-LocalModel-Session`
(else the OpenAI `user` field, else `anonymous` and no session), cleaned to a
bounded length and character set (`clean_name`); metrics label the caller only,
with at most `MAX_CALLER_LABELS` distinct values (`CallerLabels`).

Memory is bounded everywhere: the ring (`Ledger`, --ledger-size), the sessions
remembered (`Sessions`, `MAX_SESSIONS`, a fixed-size print each), the holders
named per record (`MAX_BEHIND`), every string in a record (`MAX_NAME`,
`MAX_ID`). Times are plain floats from whatever clock the glue uses; `arrival`
is wall-clock seconds (for `since`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from localmodel.gateway_contract import Behind, LedgerEntry, ledger_document
from localmodel.gateway_contract.headers import MAX_SESSION_CHARS

ANONYMOUS = "anonymous"
OTHER = "other"  # the metrics label of callers past the cap

MAX_NAME = 64  # characters kept of a caller or session name
MAX_ID = 64  # characters kept of a request id or model name in a record
MAX_CALLER_LABELS = 64  # distinct caller label values in metrics; the rest are `other`
MAX_SESSIONS = 4096  # sessions whose last prompt is remembered (least recently used go)
MAX_BEHIND = 8  # holders named in one record's "waited behind"; the rest are `other`

# Printable ASCII without spaces, quotes or backslashes: safe in a label, a log
# line and a terminal. Anything else becomes `_`.
_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")

Holder = tuple[str, str]  # (caller, priority) of a request holding a slot


def clean_name(raw: object, limit: int = MAX_NAME) -> str | None:
    """A caller or session name as the ledger keeps it: at most `limit`
    characters of printable ASCII (others replaced by `_`); None when empty."""
    if not isinstance(raw, str):
        return None
    value = raw.strip()[:limit]
    if not value:
        return None
    return _UNSAFE.sub("_", value)


def identify(
    caller_header: str | None, session_header: str | None, body_user: object = None
) -> tuple[str, str | None]:
    """(caller, session) of a request: the headers, else the OpenAI `user`
    field, else `anonymous` with no session."""
    caller = clean_name(caller_header) or clean_name(body_user) or ANONYMOUS
    return caller, clean_name(session_header, MAX_SESSION_CHARS)


class CallerLabels:
    """The caller label of a metric: the first `cap` distinct callers keep
    their name, every later one is `other`, so no caller can grow the
    label set without bound."""

    def __init__(self, cap: int = MAX_CALLER_LABELS) -> None:
        self.cap = cap
        self._known: set[str] = set()

    def label(self, caller: str) -> str:
        if caller in self._known:
            return caller
        if len(self._known) < self.cap:
            self._known.add(caller)
            return caller
        return OTHER


# ---- waited behind ---------------------------------------------------------------


class WaitBook:
    """Who each waiting request waits behind.

    One running integral G(t) = the integral of 1/holders(t) dt is kept; a waiter
    owes a holder G(end) - G(start) over the time both overlapped, which is that
    interval's wall time split evenly among whoever held a slot at each moment.
    Every event is O(waiters x holders), both small (slots, --max-queue).
    """

    def __init__(self) -> None:
        self._g = 0.0
        self._at: float | None = None
        self._holders: dict[int, Holder] = {}
        # waiter -> holder ticket -> [holder, G from, G to (nan: still holding)]
        self._waits: dict[int, dict[int, list[Any]]] = {}

    def _advance(self, now: float) -> None:
        if self._at is not None and now > self._at and self._holders:
            self._g += (now - self._at) / len(self._holders)
        if self._at is None or now > self._at:
            self._at = now

    def hold(self, ticket: int, holder: Holder, now: float) -> None:
        """`ticket` now holds a slot."""
        self._advance(now)
        self._holders[ticket] = holder
        for spans in self._waits.values():
            spans[ticket] = [holder, self._g, math.nan]

    def free(self, ticket: int, now: float) -> None:
        """`ticket` gave its slot back."""
        self._advance(now)
        if self._holders.pop(ticket, None) is None:
            return
        for spans in self._waits.values():
            span = spans.get(ticket)
            if span is not None and math.isnan(span[2]):
                span[2] = self._g

    def wait(self, ticket: int, now: float) -> None:
        """`ticket` starts waiting for a slot."""
        self._advance(now)
        self._waits[ticket] = {t: [h, self._g, math.nan] for t, h in self._holders.items()}

    def stop(self, ticket: int, now: float) -> dict[Holder, float]:
        """`ticket` stops waiting (given a slot, or gone): seconds owed to each holder."""
        self._advance(now)
        owed: dict[Holder, float] = {}
        for holder, start, end in (self._waits.pop(ticket, None) or {}).values():
            seconds = (self._g if math.isnan(end) else end) - start
            if seconds > 0:
                owed[holder] = owed.get(holder, 0.0) + seconds
        return owed

    @property
    def waiting(self) -> int:
        return len(self._waits)


def top_behind(owed: Mapping[Holder, float], keep: int = MAX_BEHIND) -> tuple[Behind, ...]:
    """The holders a request waited behind, longest first, at most `keep`
    named (the rest summed as caller `other`)."""
    ranked = sorted(owed.items(), key=lambda item: (-item[1], item[0]))
    named = [Behind(c, p, s) for (c, p), s in ranked[:keep]]
    rest: dict[str, float] = {}
    for (_, priority), seconds in ranked[keep:]:
        rest[priority] = rest.get(priority, 0.0) + seconds
    named += [Behind(OTHER, p, s) for p, s in sorted(rest.items())]
    return tuple(named)


# ---- re-read ---------------------------------------------------------------------


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's prompt as far as the engine's cache is concerned: `head`
    (everything that must stay equal for any reuse: model, system, tools,
    template) and either its messages (one digest each) or its text."""

    head: bytes
    units: tuple[bytes, ...] | None = None  # chat messages
    text: str | None = None  # a completion prompt

    @property
    def size(self) -> int:
        return len(self.units) if self.units is not None else len(self.text or "")

    def prefix_digest(self, n: int) -> bytes:
        if self.units is not None:
            return _digest(b"".join(self.units[:n]))
        return _digest((self.text or "")[:n].encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class PromptPrint:
    """What a session remembers of its last prompt: a fixed size whatever the
    prompt's length (its kind, head, size and the digest of all of it)."""

    chat: bool
    head: bytes
    size: int
    digest: bytes


def prompt_print(prompt: Prompt) -> PromptPrint:
    return PromptPrint(
        prompt.units is not None, prompt.head, prompt.size, prompt.prefix_digest(prompt.size)
    )


def extends(previous: PromptPrint, prompt: Prompt) -> bool:
    """Whether `prompt` starts with the whole previous prompt (so the engine
    can reuse its cache of it)."""
    return (
        previous.chat == (prompt.units is not None)
        and previous.head == prompt.head
        and prompt.size >= previous.size
        and prompt.prefix_digest(previous.size) == previous.digest
    )


_HEAD_FIELDS = ("system", "template", "tools", "raw", "suffix", "format", "response_format")


def prompt_of(kind: str, body: Mapping[str, Any]) -> Prompt | None:
    """The prompt of a generation body (`kind`: the route's Kind value), or None
    when the route has no prompt to cache (embeddings) or the body none."""
    head = _digest(_canonical([kind, body.get("model"), *(body.get(f) for f in _HEAD_FIELDS)]))
    if kind in ("chat", "openai_chat"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        return Prompt(head, units=tuple(_digest(_canonical(m)) for m in messages))
    if kind in ("generate", "openai_completion"):
        text = body.get("prompt")
        if not isinstance(text, str):
            text = _canonical(text).decode("utf-8", "surrogatepass") if text is not None else None
        return None if text is None else Prompt(head, text=text)
    return None


@dataclass(frozen=True, slots=True)
class SessionTurn:
    """What a session's new request is, against its previous one."""

    rewrite: bool  # its prompt does not extend the previous one
    previous_tokens: int | None  # the previous prompt's length in tokens, if the engine said


@dataclass(slots=True)
class _Session:
    """Keeps one session's last prompt, its length in tokens and its turn."""

    last: PromptPrint
    tokens: int | None = None  # the last prompt's length in tokens, once known
    turn: int = 0


class Sessions:
    """The last prompt of each recent session (least recently used forgotten
    past `cap`): enough to tell a rewrite, whatever the prompts' length."""

    def __init__(self, cap: int = MAX_SESSIONS) -> None:
        self.cap = cap
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def arrive(self, key: tuple[str, str], prompt: Prompt) -> tuple[SessionTurn, int]:
        """A session's new prompt: is it a rewrite? (and its turn number, to
        tell the engine's token count back with `read`)."""
        session = self._sessions.get(key)
        printed = prompt_print(prompt)
        if session is None:
            self._sessions[key] = _Session(printed)
            while len(self._sessions) > self.cap:
                self._sessions.popitem(last=False)
            return SessionTurn(rewrite=False, previous_tokens=None), 0
        self._sessions.move_to_end(key)
        rewrite = not extends(session.last, prompt)
        turn = SessionTurn(rewrite=rewrite, previous_tokens=session.tokens)
        session.last, session.tokens = printed, None
        session.turn += 1
        return turn, session.turn

    def read(self, key: tuple[str, str], turn: int, prompt_tokens: int | None) -> None:
        """The engine's count of the prompt's tokens, once it said (ignored if a
        later request of the session arrived meanwhile)."""
        session = self._sessions.get(key)
        if session is not None and session.turn == turn and prompt_tokens is not None:
            session.tokens = prompt_tokens


def reread(
    rewrite: bool | None,
    previous_tokens: int | None,
    prompt_tokens: int | None,
    cached: int | None,
    evaluated: int | None,
    prefill_seconds: float | None,
) -> tuple[int | None, float | None]:
    """(tokens, seconds) re-read by a request: on a rewrite, the tokens the
    engine evaluated, up to as many as the session's previous prompt held
    beyond what the engine could still reuse (what it had read once already);
    the rest of a longer new prompt is new reading. None where the engine did
    not say enough to know. Not a rewrite: 0."""
    if rewrite is None:
        return None, None
    if not rewrite:
        return 0, 0.0
    if previous_tokens is None:
        return None, None
    if cached is not None and evaluated is not None:
        tokens = max(0, min(evaluated, previous_tokens - cached))
        if prefill_seconds is None:
            return tokens, None
        return tokens, prefill_seconds * tokens / evaluated if evaluated > 0 else 0.0
    if prefill_seconds is not None and prompt_tokens is not None and (
        prompt_tokens <= previous_tokens
    ):
        # Everything evaluated was within the previous prompt's length,
        # whatever was reused: all of the prefill is re-read (its token
        # count unknown).
        return None, prefill_seconds
    return None, None


# ---- the ring --------------------------------------------------------------------


def behind_text(behind: Sequence[Behind]) -> str:
    """`caller X (background) 12.3 s, caller Y (foreground) 1.0 s`."""
    return ", ".join(f"caller {b.caller} ({b.priority}) {b.seconds:.1f} s" for b in behind)


@dataclass(frozen=True)
class LedgerQuery:
    """Decides which ledger entries a read asks for: since when, which caller, which priority."""

    since: float | None = None  # wall clock
    caller: str | None = None
    priority: str | None = None

    def matches(self, entry: LedgerEntry) -> bool:
        return (
            (self.since is None or entry.arrival >= self.since)
            and (self.caller is None or entry.caller == self.caller)
            and (self.priority is None or entry.priority == self.priority)
        )


class BadQuery(ValueError):
    """A /ledger query parameter we cannot use; the message names it."""


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PRIORITIES = ("foreground", "background")


def parse_since(raw: str, now: float) -> float:
    """`since`: a duration back from now (`90`, `90s`, `15m`, `2h`, `1d`) or an
    ISO 8601 time with its offset; wall-clock seconds."""
    text = raw.strip()
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT[match.group(2) or "s"]
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadQuery(
            f"since: expected a duration (90s, 15m, 2h) or an ISO 8601 time, got {raw[:40]!r}"
        ) from None
    if when.tzinfo is None:
        raise BadQuery(f"since: the time needs an offset (Z or +01:00), got {raw[:40]!r}")
    return when.timestamp()


def parse_query(params: Mapping[str, str], now: float) -> LedgerQuery:
    """The filters of GET /ledger: since, caller, priority (all optional)."""
    unknown = sorted(set(params) - {"since", "caller", "priority"})
    if unknown:
        raise BadQuery(f"{unknown[0]}: unknown filter (since, caller, priority)")
    since = parse_since(params["since"], now) if params.get("since") else None
    caller = None
    if params.get("caller"):
        caller = clean_name(params["caller"])
    priority = params.get("priority") or None
    if priority is not None and priority not in PRIORITIES:
        raise BadQuery(f"priority: expected foreground or background, got {priority[:40]!r}")
    return LedgerQuery(since, caller, priority)


class Ledger:
    """The last `size` records, oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ring: deque[LedgerEntry] = deque(maxlen=size)
        self.recorded = 0

    def add(self, entry: LedgerEntry) -> None:
        self._ring.append(entry)
        self.recorded += 1

    def __len__(self) -> int:
        return len(self._ring)

    def entries(self, query: LedgerQuery = LedgerQuery()) -> list[LedgerEntry]:
        return [e for e in self._ring if query.matches(e)]

    def document(self, query: LedgerQuery = LedgerQuery()) -> dict[str, Any]:
        """The body of GET /ledger."""
        return ledger_document(self.size, self.recorded, len(self._ring), self.entries(query))

