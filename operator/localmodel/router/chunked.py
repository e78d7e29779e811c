"""Following an HTTP/1.1 chunked body (RFC 9112, 7.1) as its bytes arrive,
split anywhere. Pure.

The router relays a replica's chunked answer to its caller as the bytes came,
without decoding and re-encoding it (router/upstream.py), so it needs only to
know where the answer ends (to finish the caller's answer and reuse the
connection) and which bytes are data (the tail it reads the accounting from).
`ChunkedBody.feed` says both; a body that breaks the framing raises
`BadFraming` and the exchange is cut, never guessed at. Its lines are checked
strictly, as the caller's own parser might not be: a chunk size of at most
`MAX_CHUNK` bytes, extensions and trailer lines of visible characters, spaces
and tabs only (a bare CR in them is refused), each trailer a `name: value`
field with a token for its name. `pending` says how many of the bytes fed
are a line not yet complete, so not yet checked: the router holds them back
(router/upstream.py), so the caller never gets a malformed line's bytes.
"""

from __future__ import annotations

from collections.abc import Callable

LINE_LIMIT = 4096  # a chunk-size line, with any extensions
TRAILER_LIMIT = 64 * 1024  # all trailer lines together
MAX_CHUNK = 1 << 30  # bytes: far above any answer a gateway sends in one chunk
_HEX = frozenset(b"0123456789abcdefABCDEF")
# RFC 9110 5.6.2 token characters; field text is visible characters, SP and HTAB.
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TEXT = frozenset(range(0x20, 0x7F)) | {0x09} | frozenset(range(0x80, 0x100))

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class BadFraming(Exception):
    """The bytes are not a chunked body."""


class ChunkedBody:
    """Keeps the state of a chunked body as it is fed, and says when it is complete."""

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0  # data bytes still to come in the current chunk
        self._line = bytearray()  # a line split between two feeds
        self._trailers = 0

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def pending(self) -> int:
        """Bytes fed that are part of a line not yet complete (not yet checked)."""
        return len(self._line)

    def feed(self, data: bytes, on_data: Callable[[bytes], None]) -> int:
        """Follow `data`, calling `on_data` with each run of data bytes.
        Returns how many bytes of `data` belong to the body: all of them,
        unless the body ended inside `data`."""
        i, n = 0, len(data)
        while i < n and self._state != _DONE:
            if self._state == _DATA:
                take = min(self._left, n - i)
                on_data(data[i:i + take] if take < n else data)
                i += take
                self._left -= take
                if not self._left:
                    self._state = _DATA_END
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self._line += data[i:]
                self._check_length(len(self._line))
                return n
            if self._line:
                self._line += data[i:end]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = data[i:end]
            self._check_length(len(line))
            i = end + 1
            self._on_line(line)
        return i

    def _check_length(self, length: int) -> None:
        if length > (TRAILER_LIMIT if self._state == _TRAILER else LINE_LIMIT):
            raise BadFraming("a chunk line is too long")

    def _on_line(self, line: bytes) -> None:
        if not line.endswith(b"\r"):
            raise BadFraming("a chunk line does not end in CRLF")
        line = line[:-1]
        if self._state == _SIZE:
            digits, _, extensions = line.partition(b";")
            digits = digits.rstrip(b" \t")
            if not digits or len(digits) > 16 or not _HEX.issuperset(digits):
                raise BadFraming(f"not a chunk size: {line[:40]!r}")
            if not _TEXT.issuperset(extensions):
                raise BadFraming(f"a control character in a chunk's extensions: {line[:40]!r}")
            self._left = int(digits, 16)
            if self._left > MAX_CHUNK:
                raise BadFraming(f"a chunk of {self._left} bytes, over {MAX_CHUNK}")
            self._state = _DATA if self._left else _TRAILER
        elif self._state == _DATA_END:
            if line:
                raise BadFraming("a chunk's data is longer than its size")
            self._state = _SIZE
        elif not line:  # _TRAILER: the empty line ends the body
            self._state = _DONE
        else:
            self._trailers += len(line) + 2
            if self._trailers > TRAILER_LIMIT:
                raise BadFraming("the trailers are too long")
            name, colon, value = line.partition(b":")
            if not colon or not name or not _TOKEN.issuperset(name) \
                    or not _TEXT.issuperset(value):
                raise BadFraming(f"not a trailer field: {line[:40]!r}")
