"""The router's signed marks: how a gateway tells the router's word from a
caller's (docs/security.md, The router's signing key). Pure.

A tenant chooses its gateway's image, so a secret every gateway held would
be a secret every tenant reads. The router therefore signs with an Ed25519
private key only it holds; each gateway is given the public key
(`--router-key`) and can check a mark but never make one.

A mark is the header `X-LocalModel-Router-Mark: <unix seconds>.<signature>`
(the signature in unpadded base64url) over, as one JSON array:
`["localmodel-router-mark/1", purpose, namespace, pod, session, seconds]`.

- purpose `owned`: on a turn the router sends to a session's owner, with the
  session's key (`X-LocalModel-Owned-Session`); the gateway lists the key in
  /slots only with this mark, made for itself, on a turn it served.
- purpose `slots`: on the router's GET /slots (session ""); only then does
  /slots list its session keys.
- purpose `yield`: on the operator's `POST /yield` to a gateway's admin port
  (gateway/door.py), with the call's body in the session slot
  (`yield_session`: `reason:idle_at_least`), so a mark for `reopen` never
  closes and one for `idle_at_least: 1800` never closes after 1 s. The
  operator holds the same key (it makes it: controller/signing.py) and signs
  with `sign_yield`. Unlike the others, a gateway takes each `yield` mark
  once (gateway/door.py, `SeenMarks`): a replay within the window is refused.
- purpose `woke`: on a request the router held while its model woke, with
  `X-LocalModel-Woke: <ms>` (gateway_contract/headers.py) and the request id
  and those milliseconds in the session slot (`woke_session`); only then does
  the gateway's ledger keep the wait (`LedgerEntry.wake_wait_s`). The mark
  goes in its own header (`WOKE_MARK_HEADER`), since the same request may
  carry an `owned` mark.

The purpose is the second item of the signed message, so purposes are
domain-separated: a mark made for one never verifies as another.

The namespace and pod are the target replica's, so a mark sent to one
replica is worthless at any other; the time bounds its replay to
`MARK_WINDOW_S` either way (clock skew between the router's and the
gateway's nodes included). Within the window a mark can be replayed only to
the same replica, for the same session, with the same purpose: it tells
that replica again what the router already told it.

The private key's form, shared by the operator (which makes it and writes
it into the router's Secret) and the router (which reads it): PEM, PKCS#8.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from localmodel.settings import ConfigError

MARK_HEADER = "X-LocalModel-Router-Mark"
MARK_WINDOW_S = 60  # a mark's age (or how far ahead of the checker's clock) at most
OWNED = "owned"
SLOTS = "slots"
YIELD = "yield"
WOKE = "woke"
PURPOSES = (OWNED, SLOTS, YIELD, WOKE)
_VERSION = "localmodel-router-mark/1"
_KEY_BYTES = 32  # an Ed25519 public key, raw
_MAX_MARK = 120  # characters of a header value: 11 digits, a dot, 86 of signature


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _message(purpose: str, namespace: str, pod: str, session: str, seconds: int) -> bytes:
    return json.dumps([_VERSION, purpose, namespace, pod, session, seconds],
                      separators=(",", ":")).encode()


class BadKey(ValueError):
    """Bytes that are not an Ed25519 private key in PEM; the message says why."""


def key_from_pem(pem: bytes) -> Ed25519PrivateKey:
    """The Ed25519 private key a PEM holds; BadKey saying why not otherwise."""
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise BadKey(f"not a PEM private key without a password ({reason})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadKey(f"a {type(key).__name__.lstrip('_')}, not an Ed25519 key")
    return key


def pem_of(key: Ed25519PrivateKey) -> bytes:
    """The key as the Secret and `--signing-key` hold it."""
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The key's public half as `--router-key` takes it: standard base64 of the raw 32 bytes."""
    return base64.b64encode(key.public_key().public_bytes_raw()).decode("ascii")


def router_key(flag: str, raw: str) -> str:
    """A `--router-key` value (standard base64 of a raw Ed25519 public key),
    checked; ConfigError names the flag and the reason."""
    text = raw.strip()
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(flag, "not base64 (the router's public key, as the operator "
                                "renders it)") from None
    if len(decoded) != _KEY_BYTES:
        raise ConfigError(flag, f"{len(decoded)} bytes, not the {_KEY_BYTES} of an "
                                "Ed25519 public key")
    return text


def public_key(text: str) -> Ed25519PublicKey:
    """The key of a value `router_key` accepted."""
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))


def sign(key: Ed25519PrivateKey, purpose: str, namespace: str, pod: str, session: str,
         now: float) -> str:
    """The header's value: `purpose` for the replica `namespace`/`pod` (and
    `session`, "" for /slots) at wall-clock `now`."""
    seconds = int(now)
    return f"{seconds}.{_b64(key.sign(_message(purpose, namespace, pod, session, seconds)))}"


def yield_session(reason: str, idle_at_least: int) -> str:
    """What a `yield` mark signs in its session slot: the call's body."""
    return f"{reason}:{idle_at_least}"


def sign_yield(key: Ed25519PrivateKey, namespace: str, pod: str, reason: str,
               idle_at_least: int, now: float) -> str:
    """The operator's mark for `POST /yield {"reason": reason, "idle_at_least":
    idle_at_least}` to the replica `namespace`/`pod`, at wall-clock `now`
    (the value of `MARK_HEADER`). A gateway takes each mark once: two calls
    with the same body to one pod need different seconds."""
    return sign(key, YIELD, namespace, pod, yield_session(reason, idle_at_least), now)


def woke_session(request_id: str, waited_ms: int) -> str:
    """What a `woke` mark signs in its session slot: the request and its wait."""
    return f"{waited_ms}:{request_id}"


def sign_woke(key: Ed25519PrivateKey, namespace: str, pod: str, request_id: str,
              waited_ms: int, now: float) -> str:
    """The router's mark for a request (`X-Request-Id` `request_id`) it held
    `waited_ms` for a wake (the value of `WOKE_MARK_HEADER`)."""
    return sign(key, WOKE, namespace, pod, woke_session(request_id, waited_ms), now)


def signed_message(value: str, session: str) -> str:
    """What a mark `verify` accepted authorises, in one canonical form (its
    seconds as a number, its session): two texts of one mark (a leading zero,
    another base64 spelling of the signature) are the same authorisation, so
    a gateway that takes a mark once keys on this, never on the text."""
    return f"{int(value.partition('.')[0])}|{session}"


def verify(key: Ed25519PublicKey | None, value: str | None, purpose: str, namespace: str,
           pod: str, session: str, now: float, window: float = MARK_WINDOW_S) -> bool:
    """Whether `value` is the router's mark of `purpose` for this replica and
    `session`, made within `window` seconds of wall-clock `now`. Anything
    else (no key, no header, a bad one) is False, never an error."""
    if key is None or value is None or len(value) > _MAX_MARK:
        return False
    seconds_text, dot, signature = value.partition(".")
    if not dot or not seconds_text.isascii() or not seconds_text.isdigit():
        return False
    seconds = int(seconds_text)
    if abs(now - seconds) > window:
        return False
    try:
        raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        key.verify(raw, _message(purpose, namespace, pod, session, seconds))
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True
