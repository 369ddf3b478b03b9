"""guarded.layers.call_check: the quick binding agrees with ``inspect.Signature.bind`` on every call."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from guarded.codec import installed_types
from guarded.errors import CallerError
from guarded.layers.call_check import argument_check, call_hook
from guarded.policy import Argument
from guarded.policy_table import PolicyTable
from guarded.protocol import protocol_signature

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
    "def f(a, b=1, /): pass",
    "def f(a, b=1, /, *, k): pass",
    "def f(*, a, b, c=None, **kw): pass",
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
    hook = call_hook(check)
    for count in range(4):
        for keywords in itertools.chain.from_iterable(
            itertools.combinations("abcdekz", size) for size in range(4)
        ):
            args, kwargs = tuple(range(count)), dict.fromkeys(keywords, 0)
            try:
                signature.bind(*args, **kwargs)
            except TypeError as refused:
                with pytest.raises(CallerError, match=f"^f\\(\\): {refused}"):
                    check(args, kwargs)
                with pytest.raises(CallerError, match=f"^f\\(\\): {refused}"):
                    hook(SimpleNamespace(args=args, kwargs=kwargs))
            else:
                check(args, kwargs)
                assert hook(SimpleNamespace(args=args, kwargs=kwargs)) is None


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


class _Anything:
    """Has every attribute (a duck-typed record)."""

    def __getattr__(self, name: str) -> Any:
        return None


class _Dict(dict[str, Any]):
    pass


def _values() -> list[Any]:
    from guarded import models
    from guarded.codec import installed_types

    values: list[Any] = [None, "text", 3, [], {}, _Dict(), _Anything(), object()]
    for record in (
        "StoredEvent",
        "RemoteBinding",
        "TaskState",
        "StateUpdate",
        "SteeringEvent",
        "PlannerEvent",
    ):
        for types in (models, installed_types()):
            cls = getattr(types, record)
            values.append(cls.__new__(cls))  # its type is what the check reads
            values.append(type("Sub" + record, (cls,), {}).__new__(type("Sub" + record, (cls,), {})))
    return values


def _outcome(check: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    try:
        check(args, kwargs)
    except CallerError as refused:
        return str(refused)
    return "accepted"


@pytest.mark.parametrize("method", sorted(policy.name for policy in PolicyTable.for_state_store()))
def test_the_fast_path_accepts_and_refuses_exactly_what_the_full_check_does(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import guarded.layers.call_check as call_check

    policy = PolicyTable.for_state_store().get(method)
    signature = protocol_signature(method)
    if signature is None:
        return
    fast = argument_check(method, None, policy)
    monkeypatch.setattr(call_check, "_with_fast_path", lambda check, signature, arguments: check)
    full = argument_check(method, None, policy)
    assert fast is not None
    assert full is not None
    positional = [
        parameter
        for parameter in signature.parameters.values()
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    optional = [
        parameter.name
        for parameter in signature.parameters.values()
        if parameter.default is not inspect.Parameter.empty
        and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY
    ]
    hook = call_hook(fast)
    values = _values()
    for count in range(len(positional) + 2):
        for position in range(max(count, 1)):
            for value in values:
                args = tuple(value if index == position else f"arg{index}" for index in range(count))
                shapes: list[dict[str, Any]] = [
                    {},
                    {"unexpected": 1},
                    {positional[0].name: value} if positional else {},
                    *({name: value} for name in optional),
                    dict.fromkeys(optional, value),
                    {**dict.fromkeys(optional, None), "unexpected": 1},
                ]
                for kwargs in shapes:
                    expected = _outcome(full, args, kwargs)
                    assert _outcome(fast, args, kwargs) == expected, (method, args, kwargs)
                    assert _hook_outcome(hook, args, kwargs) == expected, (method, args, kwargs)


def _hook_outcome(hook: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    try:
        assert hook(SimpleNamespace(args=args, kwargs=kwargs)) is None
    except CallerError as refused:
        return str(refused)
    return "accepted"


def test_an_optional_typed_argument_passed_by_keyword_is_checked_on_the_fast_path() -> None:
    class Store:
        async def save_update(self, update: Any, *, follow_up: Any = None, note: str = "") -> None:
            return None

    base = PolicyTable.for_state_store().get("save_update")
    policy = dataclasses.replace(base, arguments=(*base.arguments, Argument("follow_up", 1, "StateUpdate")))
    update_type = installed_types().StateUpdate
    update = update_type.__new__(update_type)
    fast = argument_check("save_update", Store().save_update, policy)
    assert fast is not None
    hook = call_hook(fast)
    for check in (fast, lambda args, kwargs: hook(SimpleNamespace(args=args, kwargs=kwargs))):
        check((update,), {"note": "fine"})
        check((update,), {"follow_up": update})
        with pytest.raises(CallerError, match="'follow_up' must be"):
            check((update,), {"follow_up": "not an update"})
        with pytest.raises(CallerError, match="'follow_up' must be"):
            check((update,), {"note": "fine", "follow_up": 3})
