"""The policy table's keys read in one step (``builtin_policies._key``) answer exactly what the
getters they are made of answer one by one, for every call shape."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from guarded.builtin_policies import _general_key, _key
from guarded.policy import arg, attr_of

RECORD = SimpleNamespace(trace_id="t", context_id="c", task_id=None)
OTHER = SimpleNamespace(trace_id="t2")

GETTERS = {
    "pair of arguments": (arg("trace_id", 0), arg("session_id", 1)),
    "triple of arguments": (arg("trace_id", 0), arg("context_id", 1), arg("task_id", 2)),
    "pair of attributes": (attr_of("binding", 0, "trace_id"), attr_of("binding", 0, "context_id")),
    "triple of attributes": (
        attr_of("binding", 0, "trace_id"),
        attr_of("binding", 0, "context_id"),
        attr_of("binding", 0, "task_id"),
    ),
    "attributes of two arguments": (attr_of("binding", 0, "trace_id"), attr_of("other", 1, "trace_id")),
    "an argument and an attribute": (arg("trace_id", 0), attr_of("binding", 1, "trace_id")),
}

VALUES = ("a", "b", RECORD, OTHER, None, 7)
NAMES = ("trace_id", "session_id", "context_id", "task_id", "binding", "other", "extra")


def shapes() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Positional calls of 0 to 4 arguments, keyword calls of 0 to 3 names, and both mixed."""
    found: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for count in range(5):
        for args in itertools.product(VALUES[:3], repeat=count):
            found.append((args, {}))
    for count in range(4):
        for names in itertools.combinations(NAMES, count):
            kwargs = {name: VALUES[index % len(VALUES)] for index, name in enumerate(names)}
            found.append(((), kwargs))
            found.append((("a",), kwargs))
            found.append((("a", RECORD, "c"), kwargs))
    return found


@pytest.mark.parametrize("kind", sorted(GETTERS))
def test_a_key_read_in_one_step_answers_as_its_getters_do(kind: str) -> None:
    getters = GETTERS[kind]
    direct, general = _key(*getters), _general_key(*getters)
    for args, kwargs in shapes():
        assert direct(args, kwargs) == general(args, kwargs), (args, kwargs)
        assert direct(args, kwargs) == tuple(getter(args, kwargs) for getter in getters), (args, kwargs)


def test_getters_of_other_kinds_keep_the_general_key() -> None:
    def custom(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return len(args)

    made = _key(arg("trace_id", 0), custom)
    assert made((), {}) == (None, 0)
    assert made(("t", "s"), {}) == ("t", 2)
