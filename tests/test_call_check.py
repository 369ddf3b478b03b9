"""guarded.call_check: the quick binding agrees with ``inspect.Signature.bind`` on every call."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest

from guarded.call_check import argument_check, protocol_signature
from guarded.errors import CallerError
from guarded.policy import PolicyTable

SIGNATURES = [
    "def f(a): pass",
    "def f(a, b=1): pass",
    "def f(a, *, k): pass",
    "def f(a, *, k=1): pass",
    "def f(*, a, b=None): pass",
    "def f(a, /, b): pass",
    "def f(a, /, b=1, *, c): pass",
    "def f(a, /, **kw): pass",
    "def f(a, b=1, /, *args, k): pass",
    "def f(a, *args): pass",
    "def f(a, **kw): pass",
    "def f(a, b=2, *args, k=3): pass",
    "def f(a, b=2, *, k=3, **kw): pass",
    "def f(): pass",
    "def f(a, b, c=1, *, d, e=2): pass",
]


def _function(source: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    return namespace["f"]


@pytest.mark.parametrize("source", SIGNATURES)
def test_a_call_is_refused_exactly_when_python_would_refuse_it(source: str) -> None:
    function = _function(source)
    signature = inspect.signature(function)
    policy = PolicyTable.for_state_store().get("some_method")
    check = argument_check("f", function, policy)
    assert check is not None
    for count in range(4):
        for keywords in itertools.chain.from_iterable(
            itertools.combinations("abcdekz", size) for size in range(3)
        ):
            args, kwargs = tuple(range(count)), dict.fromkeys(keywords, 0)
            try:
                signature.bind(*args, **kwargs)
            except TypeError as refused:
                with pytest.raises(CallerError, match=f"^f\\(\\): {refused}"):
                    check(args, kwargs)
            else:
                check(args, kwargs)


def test_a_store_that_says_nothing_is_checked_against_the_protocol() -> None:
    async def forwarding(*args: Any, **kwargs: Any) -> None:
        return None

    table = PolicyTable.for_state_store()
    check = argument_check("list_updates", forwarding, table.get("list_updates"))
    assert check is not None
    check(("s",), {"since_id": "u1", "limit": 5})
    with pytest.raises(CallerError, match="unexpected keyword argument 'since'"):
        check(("s",), {"since": "u1"})
    alias = argument_check("list_task_updates", forwarding, table.get("list_task_updates"))
    assert alias is not None
    with pytest.raises(CallerError, match="too many positional arguments"):
        alias(("s", "task"), {})
    assert protocol_signature("not_a_protocol_method") is None
    takes_anything = _function("def f(a, b=2, *args, k=3, **kw): pass")
    assert argument_check("custom", takes_anything, table.get("custom")) is None
    assert argument_check("custom", forwarding, table.get("custom")) is None
