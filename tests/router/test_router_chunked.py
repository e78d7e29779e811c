"""What the router's byte relay reads of a replica's answer (router/chunked.py,
router/upstream.py's `parse_head`): where a chunked body's data lies and
where it ends, however its bytes are split, and the answer's framing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.router.chunked import BadFraming, ChunkedBody
from localmodel.router.upstream import CHUNKED, CLOSE, EMPTY, LENGTH, UpstreamError, parse_head

pytestmark = pytest.mark.unit


def _encode(pieces: list[bytes], extension: bytes, trailers: list[bytes]) -> bytes:
    out = b"".join(b"%x%b\r\n%b\r\n" % (len(p), extension, p) for p in pieces if p)
    return out + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


def _follow(body: ChunkedBody, parts: list[bytes]) -> tuple[bytes, int]:
    """The data found and how many bytes of all parts belonged to the body."""
    data: list[bytes] = []
    used = 0
    for part in parts:
        if body.done:
            break
        used += body.feed(part, data.append)
    return b"".join(data), used


def _split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    return [raw[a:b] for a, b in itertools.pairwise(points)]


@given(pieces=st.lists(st.binary(max_size=300), max_size=8),
       extension=st.sampled_from([b"", b";name=value", b" ; x"]),
       trailers=st.lists(st.sampled_from([b"X-Checksum: 1", b"Expires: 0"]), max_size=2),
       cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12),
       after=st.binary(max_size=20))
def test_a_chunked_body_is_followed_to_its_end_however_it_is_split(
        pieces: list[bytes], extension: bytes, trailers: list[bytes], cuts: list[int],
        after: bytes) -> None:
    raw = _encode(pieces, extension, trailers)
    body = ChunkedBody()
    data, used = _follow(body, _split(raw + after, cuts))
    assert body.done
    assert data == b"".join(pieces)
    assert used == len(raw)  # nothing after the end is taken for the body


def test_a_body_not_yet_ended_is_not_done() -> None:
    body = ChunkedBody()
    data, _ = _follow(body, [b"5\r\nhel", b"lo\r\n", b"0\r\n"])
    assert data == b"hello" and not body.done


@pytest.mark.parametrize("raw", [
    b"zz\r\nhello\r\n",  # not hex
    b"5\r\nhello!\r\n",  # data longer than its size
    b"5\nhello\r\n",  # a bare LF
    b"\r\n",  # no size
    b"1" * 5000,  # a size line without end
    b"11111111111111111\r\n",  # a size past any body
    b"ffffffffffffffff\r\n",  # sixteen digits, but past MAX_CHUNK
    b"5;a\rb\r\nhello\r\n",  # a bare CR in the extensions
    b"5;a\x00b\r\nhello\r\n",  # a NUL in the extensions
    b"0\r\nNoColon\r\n\r\n",  # a trailer line without a colon
    b"0\r\nBad Name: 1\r\n\r\n",  # a trailer name that is not a token
    b"0\r\nX-A: a\rb\r\n\r\n",  # a bare CR in a trailer's value
])
def test_a_broken_chunked_body_is_refused_not_guessed(raw: bytes) -> None:
    with pytest.raises(BadFraming):
        ChunkedBody().feed(raw, lambda _: None)


def test_the_bytes_of_a_line_not_yet_complete_are_pending_until_it_ends() -> None:
    body = ChunkedBody()
    assert body.feed(b"5\r\nhello\r\n3;ext=", lambda _: None) == 16
    assert body.pending == len(b"3;ext=")
    body.feed(b"v", lambda _: None)
    assert body.pending == len(b"3;ext=v")
    body.feed(b"\r\nabc", lambda _: None)
    assert body.pending == 0


@pytest.mark.parametrize(("head", "framing", "length", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", CHUNKED, 0, True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12", LENGTH, 12, True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0", EMPTY, 0, True),
    (b"HTTP/1.1 204 No Content", EMPTY, 0, True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3", LENGTH, 3, False),
    (b"HTTP/1.1 200 OK", CLOSE, 0, False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 3", LENGTH, 3, False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3", LENGTH, 3, True),
])
def test_an_answers_head_says_how_its_body_is_framed(
        head: bytes, framing: str, length: int, keep_alive: bool) -> None:
    parsed = parse_head(head)
    assert (parsed.framing, parsed.length, parsed.keep_alive) == (framing, length, keep_alive)


def test_an_answers_headers_are_kept_in_order() -> None:
    parsed = parse_head(b"HTTP/1.1 429 Too Many\r\nContent-Type: application/json\r\n"
                        b"Retry-After:  3 \r\nContent-Length: 2")
    assert parsed.status == 429
    assert parsed.headers[:2] == [("Content-Type", "application/json"), ("Retry-After", "3")]


@pytest.mark.parametrize("head", [
    b"SPDY/3 200 OK",
    b"HTTP/1.1 2000 OK",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 200 OK\r\nno colon here",
    b"HTTP/1.1 200 OK\r\n Folded: value",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip",
])
def test_a_head_the_router_cannot_follow_is_refused(head: bytes) -> None:
    with pytest.raises(UpstreamError) as refused:
        parse_head(head)
    assert refused.value.reason == "connect"
