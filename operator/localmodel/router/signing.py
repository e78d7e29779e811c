"""The router's signing key (`--signing-key`), and the salt of its session
keys. Pure but for `read_signing_key`.

The key is an Ed25519 private key, PEM (PKCS#8, gateway_contract/marks.py's
`pem_of`), as the operator writes it into the router's Secret
(controller/signing.py). Every router replica mounts
the same Secret, so they sign alike and derive the same salt: the session
keys they compute agree, and gateways accept every one's marks.

The salt keys the session-key digest (router/session.py): a key listed in a
gateway's /slots cannot be matched against a guessed prompt by anyone
without the private key. It is an HMAC-SHA256 of a fixed label under the
private key's raw bytes, so it changes when the key does (a rotation starts
every session's key afresh: their owners are placed again).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.marks import BadKey, key_from_pem
from localmodel.settings import ConfigError

FLAG = "signing-key"
_SALT_LABEL = b"localmodel-router session-key salt/1"
MAX_KEY_FILE = 4096  # bytes: an Ed25519 PEM is 119


def read_signing_key(path: str) -> Ed25519PrivateKey:
    """The key in the file `path`; ConfigError names --signing-key and why not."""
    try:
        with Path(path).open("rb") as f:
            pem = f.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise ConfigError(FLAG, f"{path}: {exc.strerror or exc}") from None
    if len(pem) > MAX_KEY_FILE:
        raise ConfigError(FLAG, f"{path}: over {MAX_KEY_FILE} bytes, not an Ed25519 key")
    try:
        return key_from_pem(pem)
    except BadKey as exc:
        raise ConfigError(FLAG, f"{path}: {exc}") from None


def session_salt(key: Ed25519PrivateKey) -> bytes:
    """The 32-byte salt of the session keys (router/session.py), from the key."""
    return hmac.new(key.private_bytes_raw(), _SALT_LABEL, hashlib.sha256).digest()
