"""The overflow key scrubbed from what a caller reads, however the endpoint's
answer is cut: `KeyScrubber` (the relayed stream, bytes) and `OllamaReply`
(the translated one, text), pure. Through the gateway, with the stand-in
endpoint echoing the key across two reads: tests/gateway/test_overflow.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.gateway.overflow import KeyScrubber, OllamaReply, key_forms, scrub
from localmodel.gateway.routes import Kind

KEY = "sk-proj-Ab3/x9"
# What keys are made of (RFC 6750's b64token), and text around them.
KEYS = st.text(alphabet="ABCXYZabcxyz0189-._~+/", min_size=4, max_size=40)
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)


def through(secret: str, pieces: list[bytes]) -> bytes:
    scrubber = KeyScrubber(secret)
    return b"".join(scrubber.feed(p) for p in pieces) + scrubber.close()


def test_a_key_split_at_every_position_between_two_chunks_never_gets_through() -> None:
    for form in key_forms(KEY):
        whole = b'data: {"error":"bad key ' + form + b' given"}\n\n'
        for cut in range(len(whole) + 1):
            out = through(KEY, [whole[:cut], whole[cut:]])
            assert out == b'data: {"error":"bad key [redacted] given"}\n\n', (form, cut)


@given(KEYS, TEXT, TEXT, st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_the_stream_scrubs_as_the_whole_does_however_it_is_cut(
    secret: str, before: str, after: str, cuts: list[int]
) -> None:
    whole = (before + secret + after + secret).encode()
    bounds = sorted({min(c, len(whole)) for c in cuts})
    pieces = [whole[a:b] for a, b in zip([0, *bounds], [*bounds, len(whole)], strict=True)]
    out = through(secret, pieces)
    assert out == scrub(whole, secret)
    assert not any(form in out for form in key_forms(secret))
    assert out.count(b"[redacted]") >= 2


@given(TEXT, st.lists(st.integers(min_value=0, max_value=80), max_size=5))
def test_without_the_key_the_stream_is_unchanged(text: str, cuts: list[int]) -> None:
    whole = text.encode()
    bounds = sorted({min(c, len(whole)) for c in cuts})
    pieces = [whole[a:b] for a, b in zip([0, *bounds], [*bounds, len(whole)], strict=True)]
    assert through(KEY, pieces) == whole
    assert through("", pieces) == whole


def test_nothing_is_held_back_unless_the_tail_could_begin_the_key() -> None:
    scrubber = KeyScrubber(KEY)
    assert scrubber.feed(b"data: {}\n\n") == b"data: {}\n\n"
    assert scrubber.feed(b"ends with sk-pr") == b"ends with "
    assert scrubber.feed(b"ize") == b"sk-prize"


def test_the_json_escaped_forms_are_scrubbed_too() -> None:
    assert set(key_forms('a/b"c')) == {b'a/b"c', b'a/b\\"c', b'a\\/b\\"c'}
    # A key ending in a backslash: its escaped form is longer, and wins.
    assert through("k\\", [b"x k", b"\\", b"\\ y"]) == b"x [redacted] y"


def sse(content: str) -> bytes:
    event = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


END = (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
       b"data: [DONE]\n\n")


@pytest.mark.parametrize("kind", [Kind.CHAT, Kind.GENERATE])
def test_a_key_streamed_a_token_at_a_time_is_scrubbed_in_the_ollama_translation(
    kind: Kind,
) -> None:
    """Split between two events at every position, and between two reads of
    one event: the caller's NDJSON never holds the key."""
    said = f"the key is {KEY}, done"
    field = "message" if kind is Kind.CHAT else "response"
    for cut in range(len(said) + 1):
        stream = sse(said[:cut]) + sse(said[cut:]) + END
        for read in (len(stream), len(stream) // 2 + cut):
            reply = OllamaReply(kind, "big", "t", KEY)
            out = reply.feed(stream[:read]) + reply.feed(stream[read:]) + reply.close()
            lines = [json.loads(line) for line in out.splitlines()]
            told = "".join(
                (o[field]["content"] if kind is Kind.CHAT else o[field]) for o in lines
            )
            assert told == "the key is [redacted], done", (cut, read)
            assert KEY.encode() not in out
            assert lines[-1]["done"] is True


def test_the_whole_ollama_translation_is_scrubbed() -> None:
    doc = {"choices": [{"message": {"content": f"k={KEY}", "reasoning_content": KEY},
                        "finish_reason": "stop"}]}
    out = OllamaReply(Kind.CHAT, "big", "t", KEY).whole(doc)
    assert out["message"] == {"role": "assistant", "content": "k=[redacted]",
                              "thinking": "[redacted]"}
