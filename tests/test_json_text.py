"""Fast JSON text: ``compact_json`` and ``canonical_json`` write what ``json.dumps`` writes, and
``parse_json`` reads what ``json.loads`` reads (the same value or the same error), whichever way
(``orjson`` or the standard library) each takes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guarded.codec import (
    canonical_json,
    compact_json,
    event_fingerprint,
    event_fingerprint_and_text,
    parse_json,
)
from guarded.codec.json_text import compact_and_canonical_json

floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e-4, 9.9e-5, 1e-5, 5e-324, 1e16, 9999999999999998.0, 1e22, -0.0, 0.0]
)
integers = st.integers(min_value=-(2**80), max_value=2**80) | st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]
)
SPECIAL_CHARACTERS = ["\x00", "\x1f", "\x7f", "é", "🐧", "\u2028", '"', "\\"]
texts = st.text() | st.text(alphabet=st.sampled_from(SPECIAL_CHARACTERS))
values = st.recursive(
    st.none() | st.booleans() | integers | floats | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=20,
)


def _outcome(function: Any, argument: Any) -> tuple[str, str]:
    try:
        return "value", repr(function(argument))
    except (ValueError, TypeError, RecursionError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_texts_are_json_dumps_texts(value: Any) -> None:
    options: dict[str, Any] = {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":")}
    assert compact_json(value) == json.dumps(value, **options)
    assert canonical_json(value) == json.dumps(value, sort_keys=True, **options)


@settings(max_examples=400, deadline=None)
@given(values)
def test_both_texts_at_once_are_each_text(value: Any) -> None:
    assert _outcome(compact_and_canonical_json, value) == _outcome(
        lambda both: (compact_json(both), canonical_json(both)), value
    )


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(texts, values, max_size=5), integers | floats)
def test_an_event_fingerprint_and_text_at_once_are_each(event: dict[str, Any], ts: int | float) -> None:
    event = {**event, "ts": ts}
    assert event_fingerprint_and_text(event) == (event_fingerprint(event), compact_json(event))


@pytest.mark.parametrize("value", [{"x": math.nan}, {"x": [math.inf]}, {"x": object()}])
def test_what_json_dumps_refuses_is_refused(value: Any) -> None:
    for encode in (compact_json, canonical_json, compact_and_canonical_json):
        with pytest.raises((ValueError, TypeError)):
            encode(value)


@settings(max_examples=400, deadline=None)
@given(values)
def test_parse_json_reads_what_json_loads_reads(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert _outcome(parse_json, text) == _outcome(json.loads, text)
    assert _outcome(parse_json, text.encode("utf-8")) == _outcome(json.loads, text.encode("utf-8"))


@pytest.mark.parametrize(
    "text",
    [
        "-9223372036854775809",  # beyond 64 bits: orjson would read a float
        "[18446744073709551616, 0.1234567890123456789]",
        "1e400",
        "[NaN, Infinity, -Infinity]",
        '"\\ud800"',  # a lone surrogate escape
        '"\ud800"',
        '{"a": 1, "b": 2, "a": 3}',
        "\ufeff[1]",
        "[1,]",
        "",
        "[" * 3000 + "]" * 3000,
        b"\xef\xbb\xbf[1]",  # bytes: a byte order mark, UTF-16, an encoded surrogate, bad UTF-8
        '"é"'.encode("utf-16"),
        b'"\xed\xa0\x80"',
        b'"\xff"',
    ],
)
def test_parse_json_reads_the_edge_cases_as_json_loads(text: str | bytes) -> None:
    assert _outcome(parse_json, text) == _outcome(json.loads, text)
