"""The capability-preserving proxy class.

Each guard gets its own generated class whose attributes are exactly the store's: guarded
coroutine methods for the store's async methods, forwarding properties for everything else.
``hasattr(proxy, name) == hasattr(store, name)`` for every non-dunder name, and
``isinstance(proxy, P)`` against the runtime-checkable protocols answers as for the store,
whether Python checks with ``hasattr`` (3.11) or ``inspect.getattr_static`` (3.12+). The proxy
holds no attribute of its own; its controls live in :func:`guarded.controller`.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

_MISSING = object()

MethodFactory = Callable[[str, Callable[..., Any]], Callable[..., Any]]


def is_async_callable(value: object) -> bool:
    """Whether calling ``value`` returns a coroutine (functions, bound methods, async ``__call__``)."""
    if inspect.iscoroutinefunction(value):
        return True
    if inspect.isfunction(value) or inspect.ismethod(value) or not callable(value):
        return False
    return inspect.iscoroutinefunction(type(value).__call__)


class CallShape(Enum):
    """What calling an attribute gives, as far as can be told without calling it."""

    ASYNC = "async"
    """A coroutine function, an async ``__call__``, an ``AsyncMock``, a partial of one, a sync
    wrapper (``functools.wraps``) of one, or a callable declared to return an awaitable."""
    SYNC = "sync"
    """A callable declared to return something that is not awaitable (``-> None``, ``-> list``)."""
    UNKNOWN = "unknown"
    """A callable that says nothing (a lambda, an unannotated function): only a call would tell."""
    NOT_CALLABLE = "not_callable"


_AWAITABLE_WORDS = ("Awaitable", "Coroutine", "Future", "Task")


def _underlying(value: object) -> Iterator[object]:
    """``value`` and what it stands for: the function of a bound method, a partial's function,
    what ``functools.wraps`` wrapped, the ``__call__`` of a callable object."""
    seen: set[int] = set()
    current: object = value
    while id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        yield current
        if isinstance(current, functools.partial):
            current = current.func
        elif inspect.ismethod(current):
            current = current.__func__
        elif (wrapped := getattr(current, "__wrapped__", _MISSING)) is not _MISSING:
            current = wrapped
        elif not (inspect.isfunction(current) or inspect.isbuiltin(current) or isinstance(current, type)):
            current = inspect.getattr_static(type(current), "__call__", None)
            if current is None:
                return
        else:
            return


def _declared_awaitable(value: object) -> bool | None:
    """Whether ``value``'s return annotation says awaitable (``True``), not awaitable
    (``False``), or nothing usable (``None``)."""
    try:
        signature = inspect.signature(value, follow_wrapped=False, eval_str=True)  # type: ignore[arg-type]
    except Exception:
        try:
            signature = inspect.signature(value, follow_wrapped=False)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    declared = signature.return_annotation
    if declared is inspect.Signature.empty or declared is Any or declared is object:
        return None
    if isinstance(declared, str):
        if any(word in declared for word in _AWAITABLE_WORDS):
            return True
        return False if declared.strip() == "None" else None
    if declared is None or declared is type(None):
        return False
    origin = typing.get_origin(declared) or declared
    if origin is typing.Union or origin is types.UnionType:
        answers = {_declared_awaitable_type(arg) for arg in typing.get_args(declared)}
        return True if True in answers else (False if answers == {False} else None)
    return _declared_awaitable_type(declared)


def _declared_awaitable_type(declared: object) -> bool | None:
    if declared is None or declared is type(None):
        return False
    origin = typing.get_origin(declared) or declared
    if isinstance(origin, type):
        return issubclass(origin, collections.abc.Awaitable)
    return None


def call_shape(value: object) -> CallShape:
    """How ``value`` behaves when called, found without calling it (see :class:`CallShape`)."""
    if not callable(value):
        return CallShape.NOT_CALLABLE
    if is_async_callable(value):
        return CallShape.ASYNC
    chain = list(_underlying(value))
    if any(inspect.iscoroutinefunction(candidate) for candidate in chain):
        return CallShape.ASYNC
    declared = _declared_awaitable(value)
    if declared is None:
        return CallShape.UNKNOWN
    return CallShape.ASYNC if declared else CallShape.SYNC


def public_names(target: object) -> list[str]:
    return [name for name in dir(target) if not name.startswith("__")]


def async_method_names(target: object, *, exclude: frozenset[str] = frozenset()) -> list[str]:
    """Names of ``target``'s public async methods, found without evaluating its properties.

    Private methods (a leading underscore) and names in ``exclude`` are left out.
    """
    found = []
    for name in public_names(target):
        if name.startswith("_") or name in exclude:
            continue
        static = inspect.getattr_static(target, name, _MISSING)
        if isinstance(static, property):
            continue
        value = getattr(target, name, None)
        if is_async_callable(value):
            found.append(name)
    return found


Resolve = Callable[[str, Any], Any]
"""``resolve(name, value)``: what the proxy hands out for the store's attribute ``name`` whose
value is ``value`` now (a guarded method for an async one, else ``value``)."""


def _forwarding_property(target: object, name: str, resolve: Resolve | None) -> property:
    if resolve is None:
        getter: Callable[[object], Any] = lambda self: getattr(target, name)  # noqa: E731
    else:
        getter = lambda self: resolve(name, getattr(target, name))  # noqa: E731
    return property(
        getter,
        lambda self, value: setattr(target, name, value),
        lambda self: delattr(target, name),
    )


def build_proxy_class(
    target: object,
    *,
    methods: dict[str, Callable[..., Any]],
    special: dict[str, property],
    base: type,
    class_name: str,
    resolve: Resolve | None = None,
) -> type:
    """A class mirroring ``target``: ``methods`` (already guarded), ``special`` properties, and a
    forwarding property for every other public attribute. Attributes that appear on ``target``
    later, and those only ``target.__getattr__`` answers, are reached through ``__getattr__``.

    With ``resolve``, every attribute reached through a forwarding property or ``__getattr__``
    is handed out as ``resolve(name, value)``: an async method first seen then gets guarded."""
    namespace: dict[str, Any] = {}
    for name in public_names(target):
        if name in methods:
            namespace[name] = staticmethod(methods[name])
        elif name in special:
            namespace[name] = special[name]
        else:
            namespace[name] = _forwarding_property(target, name, resolve)

    if resolve is None:

        def __getattr__(self: object, name: str) -> Any:
            return getattr(target, name)

    else:

        def __getattr__(self: object, name: str) -> Any:
            return resolve(name, getattr(target, name))

    def __setattr__(self: object, name: str, value: Any) -> None:
        setattr(target, name, value)

    def __dir__(self: object) -> list[str]:
        return dir(target)

    namespace.update(
        __getattr__=__getattr__,
        __setattr__=__setattr__,
        __dir__=__dir__,
        __module__=base.__module__,
        __qualname__=class_name,
    )
    return type(class_name, (base,), namespace)
