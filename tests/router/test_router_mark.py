"""The router's signed marks (gateway_contract/marks.py) and its salted session keys
(router/signing.py, router/session.py): a gateway accepts a mark only from
the router's key, made for itself, for that session and purpose, and fresh;
a listed session key confirms no guessed prompt without the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from localmodel.gateway_contract.headers import SESSION_KEY_PATTERN
from localmodel.gateway_contract.marks import (
    MARK_WINDOW_S,
    OWNED,
    SLOTS,
    BadKey,
    key_from_pem,
    pem_of,
    public_key,
    public_key_text,
    router_key,
    sign,
    verify,
)
from localmodel.router.session import session_key
from localmodel.router.signing import read_signing_key, session_salt
from localmodel.settings import ConfigError

pytestmark = pytest.mark.unit

ROUTER = Ed25519PrivateKey.generate()
PUBLIC = ROUTER.public_key()
NOW = 1_800_000_000.0
SESSION = "f:0123456789abcdef01234567"
MARK = sign(ROUTER, OWNED, "team-a", "chat-0", SESSION, NOW)


def test_a_mark_made_for_this_replica_and_session_is_accepted() -> None:
    assert verify(PUBLIC, MARK, OWNED, "team-a", "chat-0", SESSION, NOW + 1)
    slots = sign(ROUTER, SLOTS, "team-a", "chat-0", "", NOW)
    assert verify(PUBLIC, slots, SLOTS, "team-a", "chat-0", "", NOW)


@pytest.mark.parametrize(("case", "purpose", "namespace", "pod", "session", "now"), [
    ("replayed to another namespace's pod of the same name", OWNED, "team-b", "chat-0",
     SESSION, NOW),
    ("replayed to another replica of the model", OWNED, "team-a", "chat-1", SESSION, NOW),
    ("the session key changed on the way", OWNED, "team-a", "chat-0",
     "f:0123456789abcdef01234568", NOW),
    ("an owned mark shown to /slots", SLOTS, "team-a", "chat-0", "", NOW),
    ("stale", OWNED, "team-a", "chat-0", SESSION, NOW + MARK_WINDOW_S + 1),
    ("from further ahead than the window", OWNED, "team-a", "chat-0", SESSION,
     NOW - MARK_WINDOW_S - 1),
])
def test_a_mark_anywhere_but_where_it_was_made_for_is_refused(
        case: str, purpose: str, namespace: str, pod: str, session: str, now: float) -> None:
    assert not verify(PUBLIC, MARK, purpose, namespace, pod, session, now), case


def test_a_mark_of_another_key_or_no_key_is_refused() -> None:
    forged = sign(Ed25519PrivateKey.generate(), OWNED, "team-a", "chat-0", SESSION, NOW)
    assert not verify(PUBLIC, forged, OWNED, "team-a", "chat-0", SESSION, NOW)
    assert not verify(None, MARK, OWNED, "team-a", "chat-0", SESSION, NOW)


@pytest.mark.parametrize("value", [
    None, "", ".", "abc", "1800000000", "1800000000.", "x1800000000." + MARK.split(".")[1],
    "1800000001." + MARK.split(".")[1],  # the time moved: the signature no longer holds
    MARK + "A", MARK[:-2], "1800000000.!!!!",
    "\uff11" * 10 + "." + MARK.split(".")[1],  # fullwidth digits
    "9" * 400 + "." + MARK.split(".")[1],
])
def test_a_malformed_mark_is_refused_never_an_error(value: str | None) -> None:
    assert not verify(PUBLIC, value, OWNED, "team-a", "chat-0", SESSION, NOW)


def test_the_router_key_flag_takes_the_public_key_as_the_operator_renders_it() -> None:
    text = public_key_text(ROUTER)
    assert router_key("router-key", f" {text} ") == text
    assert public_key(text).public_bytes_raw() == PUBLIC.public_bytes_raw()


@pytest.mark.parametrize(("raw", "reason"), [
    ("not base64!", "not base64"),
    ("AAAA", "3 bytes, not the 32 of an Ed25519 public key"),
])
def test_a_bad_router_key_names_the_flag_and_the_reason(raw: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        router_key("router-key", raw)
    assert "router-key" in str(err.value) and reason in str(err.value)


def test_the_signing_key_is_read_back_from_its_pem_file(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    path.write_bytes(pem_of(ROUTER))
    assert read_signing_key(str(path)).private_bytes_raw() == ROUTER.private_bytes_raw()


def test_a_signing_key_that_is_not_ed25519_or_not_there_names_the_flag(tmp_path: Path) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    with pytest.raises(BadKey, match=r"not an Ed25519 key"):
        key_from_pem(other)
    with pytest.raises(BadKey, match=r"not a PEM private key"):
        key_from_pem(b"hello")
    with pytest.raises(ConfigError, match=r"signing-key.*missing\.pem"):
        read_signing_key(str(tmp_path / "missing.pem"))


def test_session_keys_are_salted_by_the_routers_key_and_keep_their_shape() -> None:
    body = {"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "What is a CPU?"}]}
    salt = session_salt(ROUTER)
    # Every router replica reads the same Secret: the same salt, the same keys.
    again = key_from_pem(pem_of(ROUTER))
    assert session_salt(again) == salt
    mine = session_key(None, body, salt)
    assert mine == session_key(None, body, session_salt(again))
    # Without the key, the guessed prompt's digest (salted otherwise or not at
    # all) is not the listed key.
    assert session_key(None, body) != mine
    assert session_key(None, body, session_salt(Ed25519PrivateKey.generate())) != mine
    assert session_key("s-1", {}, salt) != session_key("s-1", {})
    for key in (mine, session_key("s-1", {}, salt)):
        assert key is not None and re.fullmatch(SESSION_KEY_PATTERN, key)


def test_a_router_given_an_unreadable_signing_key_exits_2_naming_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localmodel.router.cli import run_cli

    bad = tmp_path / "bad.pem"
    bad.write_bytes(b"not a key")
    for path in (bad, tmp_path / "missing.pem"):
        assert run_cli(["--replicas", "m=http://127.0.0.1:1", "--signing-key", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"--signing-key: {path}: " in err, err
