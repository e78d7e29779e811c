"""What a parsed body may hold (gateway_contract/bounds.py), as tables: the message
count and the longest string, measured in UTF-8 bytes, wherever it sits (a
key, a value, deep in a list), found without recursion. The HTTP answers are
test_admission.py's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.bounds import TooLarge, check_bounds, longest_string_over

CONFIG = replace(GatewayConfig(), max_messages=2, max_string_bytes=8)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"prompt": "12345678"}, None),  # at the limit
        ({"prompt": "123456789"}, "prompt"),
        ({"prompt": "éééé"}, None),  # 4 characters, 8 bytes
        ({"prompt": "ééééé"}, "prompt"),  # 5 characters, 10 bytes
        ({"prompt": "\ud800\ud800\ud800"}, "prompt"),  # lone surrogates: 3 bytes each
        ({"messages": [{"role": "user", "content": "x" * 9}]}, "messages"),
        ({"options": {"k" * 9: 1}}, "options"),  # a key is a string too
        ({"k" * 9: 1}, "a key"),
        ({"images": [[[["x" * 9]]]]}, "images"),
        ({"n": 123456789, "b": True, "z": None, "f": 1.5}, None),
    ],
)
def test_the_longest_string_is_found_wherever_it_sits(body: dict[str, Any], where: str | None
                                                      ) -> None:
    assert longest_string_over(body, 8) == where


def test_a_string_deeper_than_recursion_allows_is_found() -> None:
    deep: Any = "x" * 9
    for _ in range(100_000):
        deep = [deep]
    assert longest_string_over({"input": deep}, 8) == "input"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"messages": [{}, {}, {}]},
         "messages has 3 entries, over the limit of 2 (--max-messages)"),
        ({"prompt": "x" * 9}, "a string in prompt is over the limit of 8 bytes per string "
                              "(--max-string-bytes)"),
    ],
)
def test_a_body_over_a_bound_is_refused_naming_the_limit_and_its_flag(
    body: dict[str, Any], names: str
) -> None:
    with pytest.raises(TooLarge) as refused:
        check_bounds(body, CONFIG)
    assert str(refused.value) == names


def test_a_body_within_the_bounds_passes() -> None:
    check_bounds({"messages": [{"role": "user", "content": "hi"}] * 2, "model": "m"}, CONFIG)
