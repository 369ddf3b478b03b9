"""The in-memory store's keyed tables: the logical time of the write that set each last-write-wins
key (:mod:`guarded.backend`), remote bindings, planner pauses (with their TTL), tasks and
trajectories. Every method runs under the store's lock and never awaits."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import cast

from guarded.backend import REPLAYING, merge_logical_time, ttl_left
from guarded.codec import JSONObject

from .memory_records import Binding, BindingKey, Coordinates, dumps, text_of

Pause = tuple[float | None, str]
"""``(expires at or None, payload JSON text)``."""


class LatestWrites:
    """The logical time of the write that set each last-write-wins key: ``(kind, key) -> time``."""

    def __init__(self) -> None:
        self._times: dict[tuple[str, Hashable], int] = {}

    def newest(self, kind: str, key: Hashable, written: int) -> bool:
        """Record a write of ``key`` with logical time ``written``; whether it may be applied.

        A direct write always is, and the key takes ``max(written, stored time + 1)``; a replay
        (:data:`~guarded.backend.REPLAYING`) only when ``written`` is not older than the
        stored time (last-write-wins). The time the key now holds is merged into the process clock.
        """
        stored = self._times.get((kind, key))
        if stored is not None and written <= stored:
            if REPLAYING.get():
                if written < stored:
                    return False
            else:
                written = stored + 1
        self._times[(kind, key)] = written
        merge_logical_time(written)
        return True

    def time_of(self, kind: str, key: Hashable) -> int:
        return self._times.get((kind, key), 0)

    def forget(self, kind: str, key: Hashable) -> None:
        self._times.pop((kind, key), None)

    def clear(self) -> None:
        self._times.clear()


class BindingTable:
    """Remote bindings by ``(trace_id, context_id, task_id)``."""

    def __init__(self, written: LatestWrites) -> None:
        self._written = written
        self.by_key: dict[BindingKey, Binding] = {}

    def put(self, data: JSONObject, written: int, next_seq: Callable[[], int]) -> bool:
        """Upsert the binding; ``False`` when a replay older than the stored binding is refused."""
        key = (text_of(data, "trace_id"), cast(str | None, data["context_id"]), text_of(data, "task_id"))
        if not self._written.newest("binding", key, written):
            return False
        self.by_key[key] = Binding.of(next_seq(), data)
        return True

    def mark_terminal(self, key: BindingKey, written: int) -> bool:
        """Mark the binding terminal (an unknown one: nothing to do); ``False`` when a replay older
        than the stored binding is refused."""
        binding = self.by_key.get(key)
        if binding is None:
            return True
        if not self._written.newest("binding", key, written):
            return False
        data: JSONObject = json.loads(binding.text)
        data["is_terminal"] = True
        self.by_key[key] = Binding.of(binding.seq, data)
        return True

    def live_with(self, wanted: Coordinates) -> list[Binding]:
        """The non-terminal bindings with these coordinates."""
        return [b for b in self.by_key.values() if b.coordinates == wanted and not b.is_terminal]

    def texts_of_session(self, router_session_id: str) -> list[str]:
        """Every binding of the router session, in first-saved order."""
        return [b.text for b in self.by_key.values() if b.router_session_id == router_session_id]

    def clear(self) -> None:
        self.by_key.clear()


class PauseTable:
    """Planner pauses by token, each loadable until it expires (``ttl``; ``None`` never), and the
    tombstones of consumed tokens: the consume's logical time, kept until the TTL after it."""

    def __init__(self, written: LatestWrites, ttl: float | None, clock: Callable[[], float]) -> None:
        self._written = written
        self._ttl = ttl
        self._clock = clock
        self.saved: dict[str, Pause] = {}
        self.consumed: dict[str, tuple[int, float | None]] = {}
        """Tombstones: ``token -> (logical time, kept until or None)``."""

    def put(self, items: Sequence[tuple[str, str]], times: Sequence[int]) -> int:
        """Store ``(token, payload text)`` pairs saved at logical ``times``: a replayed save replaces
        a tombstone only when strictly newer, and a save lives for the TTL after its call (a replay
        of a save that would have expired stores nothing). Expired pauses and tombstones go first.
        Returns how many replayed saves were refused (older than the stored pause or its tombstone)."""
        now = self._clock()
        ttl = self._ttl
        if ttl is not None:
            self._forget_expired(now)
        refused = 0
        for (token, text), written in zip(items, times, strict=True):
            left = None if ttl is None else ttl_left(ttl, written)
            if left is not None and left <= 0:
                continue
            tombstone = self.consumed.get(token)
            if tombstone is not None and written <= tombstone[0]:
                if REPLAYING.get():
                    refused += 1
                    continue
                written = tombstone[0] + 1
            if self._written.newest("pause", token, written):
                self.consumed.pop(token, None)
                self.saved[token] = (None if left is None else now + left, text)
            else:
                refused += 1
        return refused

    def _forget_expired(self, now: float) -> None:
        expired = [key for key, (until, _) in self.saved.items() if until is not None and until <= now]
        for key in expired:
            del self.saved[key]
            self._written.forget("pause", key)
        gone = [key for key, (_, until) in self.consumed.items() if until is not None and until <= now]
        for key in gone:
            del self.consumed[key]

    def take(self, token: str, saved_by: int | None, consumed_at: int) -> Pause | None:
        """Consume the pause of ``token`` at logical time ``consumed_at``, leaving its tombstone;
        ``None`` when there is none. ``saved_by``: the logical time of the save the caller
        consumes for (the guard's replay of a held consume): a newer save is left alone, and a
        tombstone of that time is left whatever was found."""
        written = self._written.time_of("pause", token)
        if saved_by is not None:
            if written > saved_by and token in self.saved:
                return None  # a consume held for an older save of the token
            consumed_at = saved_by
        entry = self.saved.pop(token, None)
        if entry is None and saved_by is None:
            return None
        self._written.forget("pause", token)
        earlier = self.consumed.get(token)
        time = max(consumed_at, written, earlier[0] if earlier is not None else 0)
        ttl = self._ttl
        self.consumed[token] = (time, None if ttl is None else self._clock() + ttl)
        return entry

    def clear(self) -> None:
        self.saved.clear()
        self.consumed.clear()


class TaskTable:
    """Tasks by session, in first-saved order; a task saved under another session moves there."""

    def __init__(self) -> None:
        self._by_session: dict[str, dict[str, str]] = {}
        self._session_of: dict[str, str] = {}

    def put(self, data: JSONObject) -> None:
        task_id, session_id = text_of(data, "task_id"), text_of(data, "session_id")
        previous = self._session_of.get(task_id)
        if previous is not None and previous != session_id:
            self._by_session[previous].pop(task_id, None)
        self._session_of[task_id] = session_id
        self._by_session.setdefault(session_id, {})[task_id] = dumps(data)

    def texts_of(self, session_id: str) -> list[str]:
        return list(self._by_session.get(session_id, {}).values())

    def forget_session(self, session_id: str) -> None:
        for task_id in self._by_session.pop(session_id, {}):
            self._session_of.pop(task_id, None)

    def clear(self) -> None:
        self._by_session.clear()
        self._session_of.clear()


class TrajectoryTable:
    """Trajectories by trace (with the session of their last save), and the traces each session
    saved, most recent last."""

    def __init__(self, written: LatestWrites) -> None:
        self._written = written
        self._by_trace: dict[str, tuple[str, str]] = {}
        self._session_traces: dict[str, dict[str, None]] = {}

    def put(self, trace_id: str, session_id: str, text: str, written: int) -> bool:
        """Upsert the trajectory; ``False`` when a replay older than the stored one is refused."""
        if not self._written.newest("trajectory", trace_id, written):
            return False
        self._by_trace[trace_id] = (session_id, text)
        traces = self._session_traces.setdefault(session_id, {})
        traces.pop(trace_id, None)
        traces[trace_id] = None
        return True

    def get(self, trace_id: str) -> tuple[str, str] | None:
        """``(session_id, text)`` of the trajectory of ``trace_id``."""
        return self._by_trace.get(trace_id)

    def traces_of(self, session_id: str) -> list[str]:
        return list(self._session_traces.get(session_id, {}))

    def forget_session(self, session_id: str) -> list[str]:
        """Forget the trajectories of the session's traces and of its ``session:{id}`` pseudo-trace;
        returns those trace ids."""
        trace_ids = [*self._session_traces.pop(session_id, {}), f"session:{session_id}"]
        for trace_id in trace_ids:
            self._by_trace.pop(trace_id, None)
            self._written.forget("trajectory", trace_id)
        return trace_ids

    def clear(self) -> None:
        self._by_trace.clear()
        self._session_traces.clear()


__all__ = ["BindingTable", "LatestWrites", "Pause", "PauseTable", "TaskTable", "TrajectoryTable"]
