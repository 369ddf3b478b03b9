"""Bulk forms: the backend method that writes many calls of a write at once, and its arguments.

Which write has a bulk form, and what each item of it carries, are columns of the policy table
(:attr:`~guarded.policy.MethodPolicy.bulk_form`, :attr:`~guarded.policy.MethodPolicy.bulk_item`):
``save_event`` → ``save_events([event, ...])``, ``save_planner_event`` →
``save_planner_events([(trace_id, event), ...])``. Batch flushes, replays and drains use them when
the backend offers them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .backend import BULK_FORMS, UNTIMED_REPLAY
from .logical_time import WRITE_TIME_ARGUMENT, kept_write_time, logical_times, replaying
from .pipeline.idempotency import KEPT_ARGUMENTS, WRITE_KEY_ARGUMENT, item_keys
from .policy import MethodPolicy
from .policy_table import PolicyTable

_TABLE = PolicyTable.for_state_store()


class SingleCall(Protocol):
    """A kept or queued call of a write method: its arguments."""

    @property
    def args(self) -> tuple[Any, ...]: ...

    @property
    def kwargs(self) -> Mapping[str, Any]: ...


def _policy(method: str) -> MethodPolicy | None:
    policy = _TABLE.get(method)
    return policy if policy.bulk_form is not None else None


BATCHED_BULK_FORMS = frozenset(policy.name for policy in _TABLE if policy.bulk_form and policy.batch)
"""The batched appends with a bulk form: what a replay groups by default
(:meth:`~guarded.deadletter.DeadLetterBuffer.replay`)."""


def bulk_method_for(store: object, method: str) -> str | None:
    """The name of ``store``'s bulk form of ``method`` (``save_event`` → ``save_events`` ...), or
    ``None`` when ``method`` has no bulk form or ``store`` does not offer it."""
    bulk = BULK_FORMS.get(method)
    if bulk is None or not callable(getattr(store, bulk, None)):
        return None
    return bulk


def bulk_methods_of(store: object) -> frozenset[str]:
    """The write methods whose bulk form ``store`` offers (what a replay may group)."""
    return frozenset(method for method in BULK_FORMS if bulk_method_for(store, method) is not None)


def _argument(method: str, call: SingleCall, index: int, name: str) -> Any:
    if index < len(call.args):
        return call.args[index]
    try:
        return call.kwargs[name]
    except KeyError:
        raise TypeError(f"{method}() call without its {name!r} argument") from None


def bulk_args(method: str, calls: Sequence[SingleCall]) -> tuple[Any, ...]:
    """Positional arguments of the bulk call that writes ``calls`` (single calls of ``method``).

    ``save_events(events)`` and ``save_updates(updates)`` take the list of single-call arguments;
    ``save_planner_events(items)`` takes ``(trace_id, event)`` pairs.
    """
    policy = _policy(method)
    if policy is None:
        raise ValueError(f"{method!r} has no bulk form; methods with one are {tuple(BULK_FORMS)}")
    parameters = policy.bulk_item
    if len(parameters) == 1:
        name = parameters[0]
        return ([_argument(method, call, 0, name) for call in calls],)
    return (
        [
            tuple(_argument(method, call, index, name) for index, name in enumerate(parameters))
            for call in calls
        ],
    )


@dataclass(frozen=True, slots=True)
class BulkReplay:
    """The bulk call that replays kept single calls of one method, with what they kept."""

    args: tuple[Any, ...]
    """Positional arguments of the bulk method."""
    item_keys: tuple[str, ...] | None
    """The item key of each call (:data:`~guarded.pipeline.idempotency.WRITE_KEY_ARGUMENT`); ``None``
    unless every call has one."""
    logical_times: tuple[int, ...] | None
    """The logical time of each call (:data:`~guarded.logical_time.WRITE_TIME_ARGUMENT`; a call
    kept without one has :data:`~guarded.backend.UNTIMED_REPLAY`); ``None`` when no call has
    one."""

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Set the item keys and logical times for the bulk call made inside the block, marked as
        a replay (:data:`~guarded.backend.REPLAYING`)."""
        with item_keys(self.item_keys), logical_times(self.logical_times), replaying():
            yield


@dataclass(frozen=True, slots=True)
class _Kept:
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def bulk_call(method: str, calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]) -> BulkReplay:
    """The bulk call that replays ``calls`` (kept single calls of ``method``)."""
    keys: list[str] = []
    times: list[int | None] = []
    kept = []
    for args, kwargs in calls:
        if WRITE_KEY_ARGUMENT in kwargs:
            keys.append(str(kwargs[WRITE_KEY_ARGUMENT]))
        times.append(kept_write_time(kwargs.get(WRITE_TIME_ARGUMENT)))
        if KEPT_ARGUMENTS & kwargs.keys():
            kwargs = {name: value for name, value in kwargs.items() if name not in KEPT_ARGUMENTS}
        kept.append(_Kept(args, kwargs))
    timed = any(time is not None for time in times)
    return BulkReplay(
        bulk_args(method, kept),
        tuple(keys) if keys and len(keys) == len(kept) else None,
        tuple(UNTIMED_REPLAY if time is None else time for time in times) if timed else None,
    )


__all__ = [
    "BATCHED_BULK_FORMS",
    "BULK_FORMS",
    "BulkReplay",
    "SingleCall",
    "bulk_args",
    "bulk_call",
    "bulk_method_for",
    "bulk_methods_of",
]
