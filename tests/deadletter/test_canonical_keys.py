"""A last-write-wins key's canonical text is what the standard encoder writes for it.

Spill files compare keys by this text across processes and versions (adoption, supersession on
replay), so the common keys' direct spelling must agree with the encoder byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guarded.codec import to_json_value
from guarded.deadletter.entries import canonical_key, index_key, index_key_of_canonical
from guarded.errors import InvalidPayloadError

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "k", 'a"b', "a\\b", "tab\there", "nul\x00", "del\x7f", "é", "\u2028", "trace-1", "\x1f"]
)
PARTS = TEXTS | st.none() | st.integers(min_value=-(2**70), max_value=2**70) | st.booleans()
KEYS = TEXTS | st.tuples(PARTS) | st.tuples(PARTS, PARTS) | st.tuples(PARTS, PARTS, PARTS)


def encoder_text(key: Any) -> str:
    return _ENCODER.encode(to_json_value(key, "key"))


@given(KEYS)
def test_canonical_key_is_the_encoders_text(key: Any) -> None:
    assert canonical_key(key) == encoder_text(key)
    assert index_key_of_canonical(canonical_key(key)) == index_key(key)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["lone \ud800", ("a", "lone \udfff"), ("a", float("nan"))])
def test_a_key_json_cannot_carry_is_refused(key: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        canonical_key(key)


def test_none_stays_none() -> None:
    assert canonical_key(None) is None
