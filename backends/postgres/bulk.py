"""Shared pieces of the bulk upserts (``save_memory_states``, ``save_tasks``, ...).

A bulk upsert takes one list: for a single-parameter method each item is that argument, for a
multi-parameter method each item is the tuple of the single method's parameters in signature
order. Its effect equals the single method called once per item, in list order.

Every item is validated before anything is written: the first bad one raises the single
method's :class:`~guarded.errors.InvalidPayloadError` with its path prefixed by the item
(``items[3].state.x``), so a caller can fall back to single writes to find it.

PostgreSQL's ``INSERT ... ON CONFLICT DO UPDATE`` refuses to touch one row twice in a statement,
so rows are de-duplicated per key before the statement (:func:`last_per_key`): the last item of
a key wins, as it would with single calls.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

from guarded.backend import REPLAYING, current_logical_times, merge_logical_time
from guarded.codec import item_arguments
from guarded.errors import InvalidPayloadError, WriteSupersededError

from .connection import Database

Row = TypeVar("Row")


def encode_items(
    items: Iterable[Any],
    encode: Callable[..., Row],
    *,
    arity: int,
    shape: str,
    name: str = "items",
) -> list[Row]:
    """``encode(*item)`` for each item (``encode(item)`` when ``arity`` is 1), in order.

    An item that is not a tuple (or list) of ``arity`` values, or that ``encode`` refuses, raises
    :class:`InvalidPayloadError` whose path starts with ``name[index]``; ``shape`` names the
    expected tuple in the message (``"(key, state)"``).
    """
    rows: list[Row] = []
    for index, item in enumerate(items):
        try:
            if arity == 1:
                rows.append(encode(item))
                continue
            rows.append(encode(*item_arguments(item, arity, shape)))
        except InvalidPayloadError as exc:
            raise exc.at(f"{name}[{index}]") from None
    return rows


def last_per_key(rows: Sequence[Row], key: Callable[[Row], Hashable]) -> list[Row]:
    """One row per key, the last one of the key, in the order of each key's last occurrence."""
    latest: dict[Hashable, Row] = {}
    for row in rows:
        identity = key(row)
        latest.pop(identity, None)  # re-inserting moves the key to the end
        latest[identity] = row
    return list(latest.values())


def last_per_key_at_first(rows: Sequence[Row], key: Callable[[Row], Hashable]) -> list[tuple[Row, int]]:
    """One row per key, the last one of the key, in the order of each key's *first* occurrence,
    each with the position (0-based) of its last occurrence.

    For tables with two orders: one fixed by a key's first save (an identity column) and one by
    its latest save (a sequence value taken on every save).
    """
    latest: dict[Hashable, tuple[Row, int]] = {}
    for position, row in enumerate(rows):
        latest[key(row)] = (row, position)  # assigning an existing key keeps its place
    return list(latest.values())


def has_duplicates(rows: Sequence[Row], key: Callable[[Row], Hashable]) -> bool:
    """Whether two rows share a key."""
    return len({key(row) for row in rows}) != len(rows)


def with_logical_times(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each row with the logical time of its item appended (:mod:`guarded.backend`)."""
    return [(*row, time) for row, time in zip(rows, current_logical_times(len(rows)), strict=True)]


def last_write_wins(assignments: str, *, replay_also: str = "") -> tuple[str, str]:
    """What ``ON CONFLICT ... DO UPDATE SET`` is followed by in a last-write-wins upsert by logical
    time (:mod:`guarded.backend`), for a direct write and for a replay: ``assignments`` (the
    columns the write sets, the conflicting row aliased ``stored``), the row's new time, and
    ``RETURNING logical_time``. A direct write is always applied and the row takes ``GREATEST(its
    time, the stored time + 1)``; a replay only when the stored time is not newer (no row returned
    otherwise; ``replay_also``: a further condition a replay must meet)."""
    condition = f" AND {replay_also}" if replay_also else ""
    direct = (
        f"{assignments}, logical_time = GREATEST(EXCLUDED.logical_time, stored.logical_time + 1) "
        "RETURNING stored.logical_time"
    )
    replay = (
        f"{assignments}, logical_time = EXCLUDED.logical_time "
        f"WHERE stored.logical_time <= EXCLUDED.logical_time{condition} RETURNING stored.logical_time"
    )
    return direct, replay


async def upsert_one(db: Database, statements: Sequence[str], method: str, *args: Any) -> None:
    """Run the single-row upsert of ``statements`` (direct, replay: see :func:`last_write_wins`)
    that fits the call in progress; merge the row's time into the process clock, or raise
    :class:`WriteSupersededError` when a replay was refused."""
    stored = await db.fetchval(statements[REPLAYING.get()], *args)
    if stored is None:
        raise WriteSupersededError(method=method)
    merge_logical_time(stored)


async def upsert_many(db: Database, statements: Sequence[str], method: str, rows: int, *args: Any) -> None:
    """:func:`upsert_one` for a statement writing ``rows`` rows: those it did not write were refused."""
    returned = await db.fetch(statements[REPLAYING.get()], *args)
    if returned:
        merge_logical_time(max(record[0] for record in returned))
    if len(returned) < rows:
        raise WriteSupersededError(rows - len(returned), method=method)


__all__ = [
    "encode_items",
    "has_duplicates",
    "last_per_key",
    "last_per_key_at_first",
    "last_write_wins",
    "upsert_many",
    "upsert_one",
    "with_logical_times",
]
