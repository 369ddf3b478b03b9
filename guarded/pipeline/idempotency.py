"""The idempotency key of the current logical store call.

``load_planner_state`` consumes its token: if the response is lost after the database ran the
consume, a blind retry would find nothing and the pause would be gone. The guard therefore
gives each *logical* call a key (the same key for every retry of that call) in the context
variable :data:`~guarded.backend.IDEMPOTENCY_KEY`; a backend that supports it (the Postgres
backend) records who consumed a token and answers a repeat with the same key again for a short
grace period, while any other caller gets ``None``.

The guard sets the key; backends only read it (:mod:`guarded.backend`)::

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
:data:`~guarded.backend.UNANSWERED_KEYS`; a backend that recovers them gives the payload consumed under one of
them to that resume (under its own key), so it is delivered to exactly one caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..backend import IDEMPOTENCY_KEY, ITEM_KEYS, UNANSWERED_KEYS
from ..context_vars import context_value
from ..logical_time import WRITE_TIME_ARGUMENT, kept_write_time, logical_times, replaying

WRITE_KEY_ARGUMENT = "_guarded_write_key"
"""Keyword argument under which a dead-lettered append keeps its item key; a replay removes it and
sets :data:`~guarded.backend.ITEM_KEYS` instead."""

KEPT_ARGUMENTS = frozenset({WRITE_KEY_ARGUMENT, WRITE_TIME_ARGUMENT})
"""Keyword arguments the guard adds to a write it keeps; a replay removes them before the call."""


def unanswered_keys(keys: tuple[str, ...] | None) -> AbstractContextManager[tuple[str, ...] | None]:
    """Set :data:`~guarded.backend.UNANSWERED_KEYS` for the calls made inside the block (``None``
    or no keys clears it)."""
    return context_value(UNANSWERED_KEYS, keys or None)


def item_keys(keys: tuple[str, ...] | None) -> AbstractContextManager[tuple[str, ...] | None]:
    """Set :data:`~guarded.backend.ITEM_KEYS` for the calls made inside the block (``None`` clears it)."""
    return context_value(ITEM_KEYS, keys)


@contextlib.contextmanager
def replayed_call(kwargs: dict[str, Any]) -> Iterator[None]:
    """For the replay of a kept write: remove what the guard kept with it from ``kwargs`` -- its
    item key (:data:`WRITE_KEY_ARGUMENT`) and the logical time of its call
    (:data:`~guarded.logical_time.WRITE_TIME_ARGUMENT`) -- and set them as
    :data:`~guarded.backend.ITEM_KEYS` and :data:`~guarded.backend.LOGICAL_TIMES` for the calls
    inside the block, marked as a replay (:data:`~guarded.backend.REPLAYING`)."""
    key = kwargs.pop(WRITE_KEY_ARGUMENT, None)
    time = kept_write_time(kwargs.pop(WRITE_TIME_ARGUMENT, None))
    with (
        item_keys(None if key is None else (str(key),)),
        logical_times(None if time is None else (time,)),
        replaying(),
    ):
        yield


def idempotency_key(key: str | None) -> AbstractContextManager[str | None]:
    """Set the idempotency key for the calls made inside the block (``None`` clears it)."""
    return context_value(IDEMPOTENCY_KEY, key)


__all__ = [
    "KEPT_ARGUMENTS",
    "WRITE_KEY_ARGUMENT",
    "idempotency_key",
    "item_keys",
    "replayed_call",
    "unanswered_keys",
]
