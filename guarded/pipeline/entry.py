"""The entry of a guarded method: what the caller calls, and the idempotency key of its call.

A repeat-safe method's service starts its own :class:`~guarded.pipeline.call.Call`
(:func:`guarded.pipeline.steps.build` with a home loop). A method not safe to
repeat blindly draws one idempotency key for every attempt of the call
(:data:`guarded.backend.IDEMPOTENCY_KEY`). A consume (``load_planner_state``) keeps the
caller's own key when it set one (its retry of the call), and claims the keys of earlier consumes
of the same token that got no answer, for a backend that recovers them (:mod:`guarded.pipeline.unanswered`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ..backend import IDEMPOTENCY_KEY, UNANSWERED_KEYS
from ..outcome import Outcome
from ..policy import Kind
from .call import Call, MethodSetup, Service
from .loops import LoopHome
from .unanswered import UnansweredConsumes

_ANSWERED = frozenset({Outcome.OK, Outcome.RETRIED, Outcome.NOT_FOUND, Outcome.STALE})
"""A consume that ended so got a definite answer."""
_OK = Outcome.OK  # the usual outcome, compared without hashing an Enum (a Python-level __hash__)
_MAYBE_COMMITTED = frozenset({Outcome.TIMEOUT, Outcome.FALLBACK, Outcome.CANCELLED})
"""A consume that ended so may have been committed without its answer reaching us."""


def entry_point(
    service: Service,
    setup: MethodSetup,
    key_prefix: str,
    counter: itertools.count[int],
    unanswered: UnansweredConsumes | None,
    home: LoopHome,
) -> Callable[..., Any]:
    """What the caller calls for ``setup``'s method: a call made on another event loop than
    ``home``'s runs on that loop (:mod:`.loops`). The service of a repeat-safe method that is no
    consume starts its calls itself: it is the method."""
    get_loop = asyncio.get_running_loop
    elsewhere = home.elsewhere
    get_key, set_key, reset_key = IDEMPOTENCY_KEY.get, IDEMPOTENCY_KEY.set, IDEMPOTENCY_KEY.reset
    get_unanswered, set_unanswered, reset_unanswered = (
        UNANSWERED_KEYS.get,
        UNANSWERED_KEYS.set,
        UNANSWERED_KEYS.reset,
    )
    consume = setup.policy.kind is Kind.CONSUME
    item_of = setup.policy.read_key if consume and unanswered is not None else None

    async def keyed_method(*args: Any, **kwargs: Any) -> Any:
        # Not safe to repeat blindly: one drawn key for every attempt of this call.
        loop = get_loop()
        if loop is not home.loop:
            return await elsewhere(keyed_method, setup, args, kwargs)
        token = set_key(key_prefix + str(next(counter)))
        try:
            return await service(Call(setup, args, kwargs, loop, loop.time()))
        finally:
            try:  # noqa: SIM105 - inline: suppress() costs a context manager per call
                reset_key(token)
            except ValueError:  # outside the call's context: a closed loop's call collected as garbage
                pass

    async def consume_method(*args: Any, **kwargs: Any) -> Any:
        # The key of this logical call: the caller's own when it set one (its retry of the call),
        # else a drawn one that nobody else ever gets. Keys of earlier consumes of the token that
        # got no answer are claimed (one consume at a time) for the backend to recover from.
        loop = get_loop()
        if loop is not home.loop:
            return await elsewhere(consume_method, setup, args, kwargs)
        own = get_key()
        key = own if own is not None else key_prefix + str(next(counter))
        item = item_of(args, kwargs) if item_of is not None else None
        if item is not None and type(item) is not str and not is_hashable(item):
            item = None
        claimed = unanswered.claim(item) if item is not None and unanswered is not None else ()
        token = set_key(key)
        # The usual consume claims nothing and runs where no keys are set: nothing to set.
        keys_token = (
            set_unanswered(tuple(claimed_key for claimed_key, _ in claimed) or None)
            if claimed or get_unanswered() is not None
            else None
        )
        call = Call(setup, args, kwargs, loop, loop.time())
        try:
            return await service(call)
        finally:
            try:
                if keys_token is not None:
                    reset_unanswered(keys_token)
                reset_key(token)
            except ValueError:  # outside the call's context: a closed loop's call collected as garbage
                pass
            outcome = call.outcome
            if (
                item is not None
                and unanswered is not None
                and outcome is not _OK
                and outcome not in _ANSWERED
            ):
                unanswered.restore(item, claimed)  # not recovered: for the next consume
                if own is None and outcome in _MAYBE_COMMITTED:
                    unanswered.remember(item, key)

    chosen = consume_method if consume else service if setup.policy.repeat_safe else keyed_method
    chosen.__name__ = chosen.__qualname__ = setup.label
    return chosen


def is_hashable(value: object) -> bool:
    """Whether ``value`` can be a dict key or set member (``hash`` does not raise ``TypeError``)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


__all__ = ["entry_point", "is_hashable"]
