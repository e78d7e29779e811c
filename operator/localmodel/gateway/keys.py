"""Who is asking, proven: the gateway's API keys (optional, --keys-file).

The file is one JSON object, mounted from the Secret that
`spec.gateway.auth.keysSecretRef` names (docs/gateway.md, API keys):

    {"keys": [{"caller": "chat-ui", "sha256": "<64 hex digits>",
               "priority": "foreground", "overflow": true, "concurrency": 4,
               "overflowBudget": {"requests": 100, "seconds": 3600}}]}

- `sha256`: the SHA-256 of the key, not the key: the Secret, the pod and the
  gateway's memory hold only what is needed to recognise a key, so reading
  the Secret does not give one away. Keys are random (e.g. `openssl rand -hex
  32`), so an unsalted hash is as good as a password hash here.
- `caller`: the name the ledger, the metrics and the access log give every
  request made with the key; with keys on, `X-LocalModel-Caller` and the
  OpenAI `user` field cannot claim another.
- `priority`: `foreground` (default: the key may ask for either) or
  `background` (every request of the key is background, whatever
  `X-Priority` says: demoted, not refused, because the gateway's default
  priority is foreground and most clients send no header).
- `overflow` (default true): whether the key's foreground requests may go to
  the overflow endpoint; `overflowBudget` bounds how many may, per window
  (default: --overflow-budget).
- `concurrency` (default none): requests of the key in the gateway at once;
  past it, 429.

Pure but for `KeysFile`, which reads the file (bounded) and reloads it when
it changes: kubelet replaces a mounted Secret's files in place (an atomic
symlink swap), so a changed Secret reaches the gateway without a restart. A
file that no longer parses keeps the keys already loaded (and says so).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from localmodel.gateway.slots import Priority
from localmodel.gateway_contract.keys import (
    KEY_NONCE_HEADER,
    KEY_PROOF_HEADER,
    bearer,
    parse_key_check,
    proof_matches,
)
from localmodel.gateway_contract.replies import json_response

MAX_FILE_BYTES = 1024 * 1024  # ~5,000 keys; more is refused
MAX_KEYS = 1000  # entries; every request compares against each, in constant time
CALLER = re.compile(r"[A-Za-z0-9._:@/+=-]{1,64}")  # what clean_name keeps unchanged
DIGEST = re.compile(r"[0-9a-f]{64}")
_ENTRY_FIELDS = frozenset(
    {"caller", "sha256", "priority", "overflow", "concurrency", "overflowBudget"}
)


class BadKeys(ValueError):
    """The keys file cannot be used; the message names the entry and field."""


@dataclass(frozen=True)
class Budget:
    """Overflowed requests allowed per window of seconds."""

    requests: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.requests} per {self.seconds:g}s"


@dataclass(frozen=True)
class KeyEntry:
    """One API key's entry: its caller, digest, and what it may ask for (priority, overflow,
    concurrency, budget)."""

    caller: str
    digest: bytes = b""  # SHA-256 of the key (32 bytes)
    priority: Priority = Priority.FOREGROUND  # the highest it may ask for
    overflow: bool = True
    concurrency: int | None = None
    budget: Budget | None = None  # None: the gateway's default (--overflow-budget)

    def priority_for(self, asked: Priority) -> Priority:
        """A background key's requests are background (demoted, not refused)."""
        return Priority.BACKGROUND if self.priority is Priority.BACKGROUND else asked


def digest_of(key: str) -> str:
    """The `sha256` a key's entry carries (hex)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRing:
    """Keeps the gateway's key entries, and decides which one a request's key is."""

    entries: tuple[KeyEntry, ...]

    def find(self, authorization: str | None) -> KeyEntry | None:
        """The entry of an `Authorization: Bearer <key>` header, or None. Every
        entry is compared, each in constant time, so the time taken says
        nothing of which entry (or how much of one) matched."""
        token = bearer(authorization)
        if token is None:
            return None
        presented = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        found = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        return found


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadKeys(f"{where}: expected an integer of at least {minimum}, got {value!r}")
    return value


def _budget(value: Any, where: str) -> Budget:
    if not isinstance(value, dict) or set(value) != {"requests", "seconds"}:
        raise BadKeys(f"{where}: expected {{\"requests\": N, \"seconds\": S}}")
    seconds = value["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
        0 < seconds <= 31 * 86400
    ):
        raise BadKeys(f"{where}.seconds: expected seconds in (0, 2678400], got {seconds!r}")
    return Budget(_int(value["requests"], f"{where}.requests", 0), float(seconds))


def _entry(raw: Any, where: str) -> KeyEntry:
    if not isinstance(raw, dict):
        raise BadKeys(f"{where}: expected an object")
    unknown = sorted(set(raw) - _ENTRY_FIELDS)
    if unknown:
        raise BadKeys(f"{where}: unknown field(s) {', '.join(unknown)}")
    caller, digest = raw.get("caller"), raw.get("sha256")
    if not isinstance(caller, str) or not CALLER.fullmatch(caller):
        raise BadKeys(f"{where}.caller: expected 1-64 of A-Z a-z 0-9 . _ : @ / + = -")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise BadKeys(f"{where}.sha256: expected 64 lowercase hex digits (the key's SHA-256)")
    priority = raw.get("priority", Priority.FOREGROUND.value)
    if priority not in (Priority.FOREGROUND.value, Priority.BACKGROUND.value):
        raise BadKeys(f"{where}.priority: expected foreground or background")
    overflow = raw.get("overflow", True)
    if not isinstance(overflow, bool):
        raise BadKeys(f"{where}.overflow: expected true or false")
    concurrency = raw.get("concurrency")
    budget = raw.get("overflowBudget")
    return KeyEntry(
        caller=caller,
        digest=bytes.fromhex(digest),
        priority=Priority(priority),
        overflow=overflow,
        concurrency=None if concurrency is None else _int(concurrency, f"{where}.concurrency", 1),
        budget=None if budget is None else _budget(budget, f"{where}.overflowBudget"),
    )


def _no_constant(name: str) -> Any:
    raise BadKeys(f"not JSON: {name}")


def parse_keys(data: bytes) -> KeyRing:
    """The keys file's bytes -> a KeyRing; BadKeys naming what is wrong."""
    if len(data) > MAX_FILE_BYTES:
        raise BadKeys(f"over {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadKeys(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"keys"} or not isinstance(doc["keys"], list):
        raise BadKeys('expected {"keys": [...]}')
    if len(doc["keys"]) > MAX_KEYS:
        raise BadKeys(f"more than {MAX_KEYS} keys")
    entries = tuple(_entry(raw, f"keys[{i}]") for i, raw in enumerate(doc["keys"]))
    seen: set[bytes] = set()
    for i, entry in enumerate(entries):
        if entry.digest in seen:
            raise BadKeys(f"keys[{i}].sha256: the same key twice")
        seen.add(entry.digest)
    return KeyRing(entries)


def _signature(path: str) -> tuple[int, int, int]:
    st = os.stat(path)  # follows kubelet's ..data symlink
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class KeysFile:
    """The keys file, read at start (BadKeys or OSError: the gateway does not
    start) and again whenever its signature (inode, mtime, size) changes."""

    def __init__(self, path: str, log: Callable[[str], None]) -> None:
        self.path = path
        self._log = log
        self._signature = _signature(path)
        self.ring = self._read()
        self.reloads = 0

    def _read(self) -> KeyRing:
        with open(self.path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        return parse_keys(data)

    def check(self) -> bool:
        """Reload if the file changed; True when new keys were loaded."""
        try:
            signature = _signature(self.path)
            if signature == self._signature:
                return False
            self._signature = signature  # told once per change, not per check
            ring = self._read()
        except (OSError, BadKeys) as exc:
            self._log(f"gateway: keys file {self.path} unusable, keeping the keys loaded: {exc}")
            return False
        self.ring = ring
        self.reloads += 1
        self._log(f"gateway: keys file {self.path} reloaded: {len(ring.entries)} key(s)")
        return True


def key_check_answer(ring: KeyRing | None, headers: Mapping[str, str]) -> web.Response:
    """The answer to the router's key check (GET KEY_CHECK_PATH, gateway_contract/keys.py,
    `key_proof`), the gateway's and the doorman's alike: does one of the keys
    give this proof for this nonce? 204 yes (and always with keys off), 401
    no, 400 for a malformed question."""
    if ring is None:
        return web.Response(status=204)
    check = parse_key_check(headers.get(KEY_NONCE_HEADER), headers.get(KEY_PROOF_HEADER))
    if check is None:
        return json_response(400, {"error": f"{KEY_NONCE_HEADER} (32 hex digits) and "
                                            f"{KEY_PROOF_HEADER} (64 hex digits) are required"})
    nonce, proof = check
    if proof_matches((e.digest for e in ring.entries), nonce, proof):
        return web.Response(status=204)
    return json_response(401, {"error": "no key of this gateway gives that proof"},
                         {"WWW-Authenticate": 'Bearer realm="localmodel"'})
