"""Checks of a store method's scalar arguments, shared by every backend: text without lone
surrogates, optional text, finite numbers, and :func:`refusing`, which names the method (and the
argument) in the :class:`~guarded.errors.InvalidPayloadError` a check raises."""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidPayloadError
from .json_values import check_text


class refusing:
    """Attach ``method`` (and the ``argument`` the path is relative to) to any
    :class:`InvalidPayloadError` raised inside the block.

    A class, not a ``contextlib.contextmanager``: it wraps nearly every store call, and a
    generator-based context manager costs several times as much to enter and leave."""

    __slots__ = ("argument", "method")

    def __init__(self, method: str, argument: str = "") -> None:
        self.method = method
        self.argument = argument

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, trace: Any) -> None:
        if isinstance(exc, InvalidPayloadError):
            raise exc.at(self.argument).for_method(self.method) from None


def text_argument(value: Any, path: str) -> str:
    """``value`` when it is a ``str`` without lone surrogates, else :class:`InvalidPayloadError`."""
    if not isinstance(value, str):
        raise InvalidPayloadError(f"expected a string, got {type(value).__name__}", path=path)
    return check_text(value, path)


def optional_text_argument(value: Any, path: str) -> str | None:
    """:func:`text_argument` that accepts ``None``."""
    return None if value is None else text_argument(value, path)


def float_argument(value: Any, path: str) -> float:
    """``value`` (an int or a finite float) as a float (a ``double precision``); refuse what cannot
    be one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPayloadError(f"expected a number, got {type(value).__name__}", path=path)
    try:
        result = float(value)
    except OverflowError:
        # The value itself is never repeated: reasons are logged and kept with parked writes.
        raise InvalidPayloadError("an integer too large for a double precision", path=path) from None
    if not math.isfinite(result):
        raise InvalidPayloadError(f"{value!r} is not a finite number", path=path)
    return result


def item_arguments(item: Any, arity: int, shape: str) -> tuple[Any, ...]:
    """The arguments of one item of a bulk call (``save_memory_states``' ``(key, state)``):
    ``item`` as a tuple when it is a tuple or list of ``arity`` values, else
    :class:`InvalidPayloadError` naming the expected ``shape`` (the caller adds the item's path)."""
    if not isinstance(item, tuple | list) or len(item) != arity:
        got = f"{len(item)} values" if isinstance(item, tuple | list) else f"a {type(item).__name__}"
        raise InvalidPayloadError(f"expected a {shape} tuple, got {got}")
    return tuple(item)


__all__ = ["float_argument", "item_arguments", "optional_text_argument", "refusing", "text_argument"]
