"""API keys on the wire between callers, the router and the gateways: how
both read a caller's key (`bearer`), and the router's key check (GET
KEY_CHECK_PATH on a gateway's inference port; docs/router.md, Listings and
keys). Pure.

The router lists a keyed model to a caller only if the model's gateway accepts
the caller's key. It never sends the key (a tenant chooses its gateway's image):
it sends a fresh nonce and HMAC-SHA256(SHA-256(key), nonce), which a gateway
checks against the SHA-256s its keys file holds. What a gateway sees is of use
nowhere else: not a credential, and not the same twice for one key.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable

KEY_CHECK_PATH = "/keycheck"  # GET on the inference port: 204 accepted, 401 not
KEY_NONCE_HEADER = "X-LocalModel-Key-Nonce"  # 32 lowercase hex digits
KEY_PROOF_HEADER = "X-LocalModel-Key-Proof"  # 64 lowercase hex digits
MAX_BEARER = 512  # characters of a bearer token looked at; longer is simply wrong
_NONCE = re.compile(r"[0-9a-f]{32}")
_PROOF = re.compile(r"[0-9a-f]{64}")


def bearer(authorization: str | None) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None: how the gateway
    (gateway/keys.py) and the router (router/keyed.py) read a caller's key."""
    if authorization is None or len(authorization) > MAX_BEARER + 16:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def key_proof(key_digest: bytes, nonce: str) -> str:
    """The proof a key's SHA-256 gives for a nonce (hex)."""
    return hmac.digest(key_digest, nonce.encode(), "sha256").hex()


def parse_key_check(nonce: str | None, proof: str | None) -> tuple[str, bytes] | None:
    """A key check's nonce and proof (bytes), or None when either is malformed."""
    if nonce is None or proof is None or not _NONCE.fullmatch(nonce) \
            or not _PROOF.fullmatch(proof):
        return None
    return nonce, bytes.fromhex(proof)


def proof_matches(key_digests: Iterable[bytes], nonce: str, proof: bytes) -> bool:
    """Whether one of the keys (their SHA-256s) gives `proof` for `nonce`. Every
    digest is tried, each compared in constant time."""
    found = False
    message = nonce.encode()
    for digest in key_digests:
        found = hmac.compare_digest(hmac.digest(digest, message, "sha256"), proof) or found
    return found
