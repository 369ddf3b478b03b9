"""The capability-preserving proxy class.

Each guard gets its own generated class whose attributes are exactly the store's: guarded
coroutine methods for the store's async methods, forwarding properties for everything else.
``hasattr(proxy, name) == hasattr(store, name)`` for every non-dunder name, and
``isinstance(proxy, P)`` against the runtime-checkable protocols answers as for the store,
whether Python checks with ``hasattr`` (3.11) or ``inspect.getattr_static`` (3.12+). The proxy
holds no attribute of its own; its controls live in :func:`guarded.controller`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
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


def _forwarding_property(target: object, name: str) -> property:
    return property(
        lambda self: getattr(target, name),
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
) -> type:
    """A class mirroring ``target``: ``methods`` (already guarded), ``special`` properties, and a
    forwarding property for every other public attribute. Attributes that appear on ``target``
    later are reached through ``__getattr__``."""
    namespace: dict[str, Any] = {}
    for name in public_names(target):
        if name in methods:
            namespace[name] = staticmethod(methods[name])
        elif name in special:
            namespace[name] = special[name]
        else:
            namespace[name] = _forwarding_property(target, name)

    def __getattr__(self: object, name: str) -> Any:
        return getattr(target, name)

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
