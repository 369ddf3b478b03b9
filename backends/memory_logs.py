"""The in-memory store's append-only logs (events and planner events per trace, updates and
steering per session): idempotent by record key, bounded (the oldest records dropped, counted and
the first drop of each kind logged), read with PenguiFlow's cursor rules."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

logger = logging.getLogger("guarded.backends.memory")

DROP_KINDS = ("events", "updates", "steering", "planner_events")
"""Kinds of logs, the keys of :attr:`~guarded.backends.memory.InMemoryStateStore.dropped`."""


@dataclass(slots=True)
class Record:
    key: str | None
    text: str
    seq: int = 0
    ts: float = 0.0
    task_id: str | None = None


@dataclass(slots=True)
class Log:
    """An append-only log, idempotent by record key, dropping its oldest records past a bound."""

    records: deque[Record] = field(default_factory=deque)
    keys: set[str] = field(default_factory=set)

    def append(self, record: Record, bound: int) -> int | None:
        """Append and return how many old records were dropped; ``None`` when the key is present."""
        if record.key is not None:
            if record.key in self.keys:
                return None
            self.keys.add(record.key)
        self.records.append(record)
        dropped = 0
        while 0 < bound < len(self.records):
            old = self.records.popleft()
            if old.key is not None:
                self.keys.discard(old.key)
            dropped += 1
        return dropped


def page(records: Sequence[Record], *, task_id: str | None, since_id: str | None, limit: int) -> list[str]:
    """PenguiFlow's cursor rules: exclusive ``since_id`` found in the whole stream (unknown: none),
    then the ``task_id`` filter, then PenguiFlow's ``[-limit:]``: the most recent ``limit``
    records, oldest first (``limit=0``: all of them; ``-n``: all but the oldest ``n``)."""
    start = 0
    if since_id:
        start = next((index + 1 for index, record in enumerate(records) if record.key == since_id), 0)
    selected = [r.text for r in records[start:] if task_id is None or r.task_id == task_id]
    return selected[-limit:]


class BoundedLogs:
    """The logs of every kind (:data:`DROP_KINDS`), by trace or session, and what their bounds dropped."""

    def __init__(self, bounds: Mapping[str, int]) -> None:
        self._bounds = dict(bounds)
        self._dropped = dict.fromkeys(DROP_KINDS, 0)
        self.by_kind: dict[str, dict[str, Log]] = {kind: {} for kind in DROP_KINDS}

    @property
    def dropped(self) -> Mapping[str, int]:
        """Read-only live counts of records dropped by the bounds, by kind."""
        return MappingProxyType(self._dropped)

    def get(self, kind: str, key: str) -> Log | None:
        return self.by_kind[kind].get(key)

    def records(self, kind: str, key: str) -> list[Record]:
        """A copy of the records of one log (``[]`` when there is none)."""
        log = self.by_kind[kind].get(key)
        return list(log.records) if log else []

    def append(self, kind: str, key: str, record: Record) -> None:
        dropped = self.by_kind[kind].setdefault(key, Log()).append(record, self._bounds[kind])
        if not dropped:
            return
        if not self._dropped[kind]:
            logger.warning(
                "InMemoryStateStore bound reached: dropping the oldest %s beyond %d per %s",
                kind,
                self._bounds[kind],
                "session" if kind in ("updates", "steering") else "trace",
            )
        self._dropped[kind] += dropped

    def forget(self, kind: str, key: str) -> None:
        self.by_kind[kind].pop(key, None)

    def clear(self) -> None:
        """Forget every log and reset the drop counts."""
        for logs in self.by_kind.values():
            logs.clear()
        self._dropped.update(dict.fromkeys(DROP_KINDS, 0))


__all__ = ["DROP_KINDS", "BoundedLogs", "Log", "Record", "page"]
