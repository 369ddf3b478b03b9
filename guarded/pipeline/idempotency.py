"""The idempotency key of the current logical store call.

``load_planner_state`` consumes its token: if the response is lost after the database ran the
consume, a blind retry would find nothing and the pause would be gone. The guard therefore
gives each *logical* call a key (the same key for every retry of that call) in the context
variable :data:`IDEMPOTENCY_KEY`; a backend that supports it (the Postgres backend) records who
consumed a token and answers a repeat with the same key again for a short grace period, while
any other caller gets ``None``.

The guard sets the key; backends only read it::

    with idempotency_key("call-7f3a"):
        payload = await store.load_planner_state(token)   # retried attempts reuse the key

    current_idempotency_key()  # -> "call-7f3a" inside the block, None outside

A key belongs to one logical resume and the caller that made it. A caller may name its own
logical call: a key it set around a guarded ``load_planner_state`` is used instead of a drawn one,
and a retry of that call with the same key (within the backend's grace period) is answered again
-- the way to ask again for an answer the caller lost. Nobody else ever gets that key.

A resume that got no answer (timed out, cancelled, failed after reaching the backend) may still
have been consumed by the backend. The guard keeps the keys it drew for such resumes
(:mod:`guarded.pipeline.unanswered`) and hands them, once, to the next resume of the same token in
:data:`UNANSWERED_KEYS`; a backend that recovers them gives the payload consumed under one of
them to that resume (under its own key), so it is delivered to exactly one caller.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from ..context_vars import reset_context_var
from ..logical_time import WRITE_TIME_ARGUMENT, kept_write_time, logical_times, replaying

IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "guarded_idempotency_key", default=None
)
"""The key of the logical call in progress, or ``None`` outside any guarded call."""


ITEM_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "guarded_item_keys", default=None
)
"""One key per item of the append in progress, set by the guard for its own flushes and replays
of appends without a natural id (planner events). A backend that honours keys stores the i-th
item under the i-th key (instead of ``"<key>:<i>"``), so a flush whose acknowledgement was lost and
the later replay of one of its writes store that write once."""

WRITE_KEY_ARGUMENT = "_guarded_write_key"
"""Keyword argument under which a dead-lettered append keeps its item key; a replay removes it and
sets :data:`ITEM_KEYS` instead."""

KEPT_ARGUMENTS = frozenset({WRITE_KEY_ARGUMENT, WRITE_TIME_ARGUMENT})
"""Keyword arguments the guard adds to a write it keeps; a replay removes them before the call."""


UNANSWERED_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "guarded_unanswered_keys", default=None
)
"""Keys of earlier consumes of the same item whose answers never reached their callers, set by the
guard around the consume that recovers them (one consume at a time: see
:class:`guarded.pipeline.unanswered.UnansweredConsumes`). A backend that honours them (it declares
``recovers_unanswered_consumes = True``) treats an item consumed under one of these keys, within its
grace period, as not consumed yet: the current key consumes it -- atomically, so it now belongs to
the current key, and neither the old keys nor any other caller get it again."""


def current_unanswered_keys() -> tuple[str, ...]:
    """The keys of unanswered consumes the current consume may recover (see
    :data:`UNANSWERED_KEYS`); empty when there are none."""
    return UNANSWERED_KEYS.get() or ()


@contextlib.contextmanager
def unanswered_keys(keys: tuple[str, ...] | None) -> Iterator[tuple[str, ...] | None]:
    """Set :data:`UNANSWERED_KEYS` for the calls made inside the block (``None`` clears it)."""
    token = UNANSWERED_KEYS.set(keys or None)
    try:
        yield keys
    finally:
        reset_context_var(UNANSWERED_KEYS, token)


def current_item_keys() -> tuple[str, ...] | None:
    """The per-item keys of the append in progress (see :data:`ITEM_KEYS`), or ``None``."""
    return ITEM_KEYS.get()


@contextlib.contextmanager
def item_keys(keys: tuple[str, ...] | None) -> Iterator[tuple[str, ...] | None]:
    """Set :data:`ITEM_KEYS` for the calls made inside the block (``None`` clears it)."""
    token = ITEM_KEYS.set(keys)
    try:
        yield keys
    finally:
        reset_context_var(ITEM_KEYS, token)


@contextlib.contextmanager
def replayed_call(kwargs: dict[str, Any]) -> Iterator[None]:
    """For the replay of a kept write: remove what the guard kept with it from ``kwargs`` -- its
    item key (:data:`WRITE_KEY_ARGUMENT`) and the logical time of its call
    (:data:`~guarded.logical_time.WRITE_TIME_ARGUMENT`) -- and set them as :data:`ITEM_KEYS` and
    :data:`~guarded.logical_time.LOGICAL_TIMES` for the calls inside the block, marked as a replay
    (:data:`~guarded.logical_time.REPLAYING`)."""
    key = kwargs.pop(WRITE_KEY_ARGUMENT, None)
    time = kept_write_time(kwargs.pop(WRITE_TIME_ARGUMENT, None))
    with (
        item_keys(None if key is None else (str(key),)),
        logical_times(None if time is None else (time,)),
        replaying(),
    ):
        yield


def current_idempotency_key() -> str | None:
    """The idempotency key of the current logical call, or ``None``."""
    return IDEMPOTENCY_KEY.get()


@contextlib.contextmanager
def idempotency_key(key: str | None) -> Iterator[str | None]:
    """Set the idempotency key for the calls made inside the block (``None`` clears it)."""
    token = IDEMPOTENCY_KEY.set(key)
    try:
        yield key
    finally:
        reset_context_var(IDEMPOTENCY_KEY, token)


__all__ = [
    "IDEMPOTENCY_KEY",
    "ITEM_KEYS",
    "KEPT_ARGUMENTS",
    "UNANSWERED_KEYS",
    "WRITE_KEY_ARGUMENT",
    "current_idempotency_key",
    "current_item_keys",
    "current_unanswered_keys",
    "idempotency_key",
    "item_keys",
    "replayed_call",
    "unanswered_keys",
]
