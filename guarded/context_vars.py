"""Setting a context variable for a block, and unsetting it wherever the call ends.

A call of an event loop that was closed while the call waited never resumes there: the garbage
collector closes its coroutine later, running its ``finally`` blocks in whatever context the
collection happens to run in. ``ContextVar.reset`` of a token made in the call's own context then
raises ``ValueError``; nothing of the call is set in that context, so there is nothing to undo.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


def reset_context_var(variable: contextvars.ContextVar[T], token: contextvars.Token[T]) -> None:
    """``variable.reset(token)``, or nothing when this runs outside the context ``token`` was made
    in (see the module docs). Hot paths inline it as a ``try``, which costs nothing until it raises
    (the guarded entry, the dead-letter layer, the batch writer)."""
    with contextlib.suppress(ValueError):
        variable.reset(token)


@contextlib.contextmanager
def context_value(variable: contextvars.ContextVar[T], value: T) -> Iterator[T]:
    """Set ``variable`` to ``value`` for the calls made inside the block (yielding ``value``), and
    unset it when the block ends (:func:`reset_context_var`)."""
    token = variable.set(value)
    try:
        yield value
    finally:
        reset_context_var(variable, token)


__all__ = ["context_value", "reset_context_var"]
