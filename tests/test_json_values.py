"""guarded.codec.to_json_value: the copy made without paths (the usual plain tree) is exactly the
copy, or the error, of the walk that names every path."""

from __future__ import annotations

import enum
import sys
from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from guarded.codec import json_values
from guarded.codec.json_values import to_json_value
from guarded.errors import InvalidPayloadError


class Colour(enum.Enum):
    RED = "red"


class Text(str):
    pass


class Number(int):
    pass


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**1990, max_value=2**2010),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "é", "plain", Text("sub"), Number(3), Colour.RED, b"bytes"]),
    st.builds(lambda: 10**5000),  # beyond the digit limit: cannot be written as JSON text
)
keys = st.one_of(st.text(max_size=5), st.sampled_from(["é", "\udfff", Text("k"), 1, None]))
trees = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(st.text(max_size=3), children, max_size=3).map(OrderedDict),
    ),
    max_leaves=20,
)


def _answer(function: Any, value: Any) -> tuple[str, Any]:
    try:
        copied = function(value)
    except InvalidPayloadError as refused:
        return "refused", (str(refused), refused.path)
    return "copied", _typed(copied)


def _typed(value: Any) -> Any:
    """``value`` with every node's exact type beside it (``==`` alone says ``1 == True``)."""
    if isinstance(value, dict):
        return ("dict", [(type(key), key, _typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(item) for item in value])
    if isinstance(value, float) and value != value:
        return ("float", "nan")
    return (type(value), value)


@settings(max_examples=600, deadline=None)
@given(trees)
def test_the_fast_copy_agrees_with_the_walk_that_names_paths(value: Any) -> None:
    def checked(tree: Any) -> Any:
        return json_values._checked_copy(tree, "state", 0)

    def fast(tree: Any) -> Any:
        return to_json_value(tree, "state")

    assert _answer(fast, value) == _answer(checked, value)


def test_a_deep_tree_and_a_cycle_are_refused_with_their_path() -> None:
    deep: Any = []
    for _ in range(json_values.MAX_DEPTH + 1):
        deep = [deep]
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    for value in (deep, cycle):
        assert _answer(lambda tree: to_json_value(tree, "state"), value) == _answer(
            lambda tree: json_values._checked_copy(tree, "state", 0), value
        )
        assert _answer(lambda tree: to_json_value(tree, "state"), value)[0] == "refused"
    assert sys.getrecursionlimit() > json_values.MAX_DEPTH


def test_the_copy_is_a_copy() -> None:
    state = {"turns": [{"role": "user"}], "facts": {"n": 1}}
    copied = to_json_value(state)
    state["turns"][0]["role"] = "changed"  # type: ignore[index]
    state["facts"]["n"] = 2  # type: ignore[index]
    assert copied == {"turns": [{"role": "user"}], "facts": {"n": 1}}
