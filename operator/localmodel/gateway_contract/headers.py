"""The project's own headers on the wire between callers, the router and the
gateways, in one home: who is calling, which session, which replica answered
and why, the shape and length of a session's key, how long an idle session is
remembered, and a sleeping model's answer and wake wait. Both programs import
these; neither spells them again (tests/architecture/test_layers.py keeps the router out of the
gateway's modules). Pure.
"""

from __future__ import annotations

import re

# Who is asking (a caller's claim, kept in the ledger and its metrics unless
# API keys name the caller: gateway/keys.py).
CALLER_HEADER = "X-LocalModel-Caller"
# Which endpoint answered: `local` or `overflow` (the gateway, on every answer).
SERVED_BY_HEADER = "X-LocalModel-Served-By"
# Which replica the router sent a turn to, on the answer to the caller.
REPLICA_HEADER = "X-LocalModel-Replica"
# Every header of the project starts so: the router drops a replica's own
# (all but SERVED_BY_HEADER) before adding its own, so a caller reads only
# the router's.
PREFIX = "X-LocalModel-"
# A caller's name for its conversation: the router keys the session on it
# (router/session.py) and the gateway's ledger records it; both keep the
# first MAX_SESSION_CHARS characters.
SESSION_HEADER = "X-LocalModel-Session"
MAX_SESSION_CHARS = 64
# The router's header on a turn it sends to the session's owner: the session's
# key (router/session.py's `session_key`: `h:` or `f:` and 24 hex digits).
# The gateway lists the keys it was sent in /slots (`owned_sessions`, most
# recent first), so a router that has not seen a session finds its owner
# (gateway/owned.py, router/owners.py); it takes one only with the router's
# signed mark, and lists them only to the router's signed read (marks.py).
OWNED_SESSION_HEADER = "X-LocalModel-Owned-Session"
# The router's decision for a turn, on the answer to the caller and on the
# request to the replica, whose gateway keeps it in the ledger (`routed`):
# `owner`, or `spilled; owner_wait_s=..; reread_s=..; wait_s=..`.
ROUTE_HEADER = "X-LocalModel-Route"
MAX_ROUTED = 160  # characters of it a ledger record keeps
SESSION_KEY_PATTERN = r"[hf]:[0-9a-f]{24}"
MAX_SESSION_KEY = 64  # characters of an owned-session header read at all
OWNED_SESSIONS_LISTED = 512  # keys /slots lists at most (about 15 KiB)
# A session without a turn for this long is forgotten, by the router's owners
# table and by the gateway's list of owned sessions alike (its cache is likely
# gone by then).
SESSION_IDLE_S = 1800.0

# A closed gateway's answer to a slot request (503, with Retry-After): its
# model is asleep or giving its node back (gateway/door.py), so the router
# holds the request for the wake (router/holding.py) instead of passing the 503
# on. Value: `ASLEEP_VALUE`.
ASLEEP = "X-LocalModel-Asleep"
ASLEEP_VALUE = "1"
# Its Retry-After, when nothing better is known (a doorman is told its model's
# last wake: --wake-seconds): about a re-created pod's start with its weights
# already on the node (12 to 28 s on the loaded real node: docs/test-cluster.md).
ASLEEP_RETRY_AFTER_S = 15
# The router's word that it held a request while its model woke: the
# milliseconds it waited (`MAX_WOKE_MS` at most), signed with a `woke` mark in
# `WOKE_MARK_HEADER` (marks.py); the gateway's ledger keeps it only so.
WOKE_HEADER = "X-LocalModel-Woke"
WOKE_MARK_HEADER = "X-LocalModel-Woke-Mark"
MAX_WOKE_MS = 3_600_000  # an hour: the longest hold (spec.idle.holdSeconds) is 3600 s
MAX_WOKE_REQUEST_ID = 128  # characters of X-Request-Id a woke mark may sign
REQUEST_ID_HEADER = "X-Request-Id"  # the caller's name for a request (the router names a held one)

_KEY = re.compile(SESSION_KEY_PATTERN)


def owned_key(value: str | None) -> str | None:
    """An owned-session header's value when it is a session key, else None."""
    if value is None or len(value) > MAX_SESSION_KEY or not _KEY.fullmatch(value):
        return None
    return value


def woke_ms(value: str | None) -> int | None:
    """A woke header's milliseconds when it is a whole number up to MAX_WOKE_MS, else None."""
    if value is None or not 0 < len(value) <= 7 or not value.isascii() or not value.isdigit():
        return None
    ms = int(value)
    return ms if ms <= MAX_WOKE_MS else None
