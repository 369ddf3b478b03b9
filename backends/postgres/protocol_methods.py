"""The StateStore protocol's methods of :class:`~.store.PostgresStateStore` (its base
:class:`ProtocolMethods`): events, remote bindings, pauses and memory, tasks and updates,
steering, trajectories and planner events, with their bulk forms and legacy aliases. Each checks
its arguments before any I/O (:func:`~.json_codec.refusing`: an
:class:`~guarded.errors.InvalidPayloadError` naming the method and the field path) and then makes
one call on its table (:mod:`.tables`).

With read replicas (:mod:`.read_routing`) the history and list reads go through the store's
router, which picks the server, and every write of a trace or session tells the router it was
made; without them both are one test of an attribute."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from guarded.backend import REPLAYING, sanitize_steering_event
from guarded.errors import WriteSupersededError

from .bindings import encode_binding, encode_binding_key
from .bulk import encode_items
from .event_log import encode_event, encode_events
from .json_codec import check_text, refusing, to_db_text
from .planner_events import call_keys, encode_planner_event, encode_planner_events
from .read_routing import EVERY_ROUTER_SESSION, ROUTER_SESSION, SESSION, TRACE, ReadRouter, ReadScope
from .tables import Tables
from .task_states import encode_task

logger = logging.getLogger("guarded.backends.postgres")


class ProtocolMethods:
    """The StateStore protocol on the tables of one schema (the base of
    :class:`~.store.PostgresStateStore`, which sets both attributes)."""

    schema: str
    _tables: Tables
    _router: ReadRouter | None = None
    """Where reads go when the store has read replicas (``None``: always the primary)."""

    # ------------------------------------------------------------------------------------------------
    # Core audit log
    # ------------------------------------------------------------------------------------------------

    async def save_event(self, event: Any) -> None:
        """Persist a runtime event; idempotent by the event's fingerprint."""
        with refusing("save_event", "event"):
            row = encode_event(event)
        try:
            await self._tables.events.save(row)
        finally:
            if self._router is not None:
                self._router.wrote([(TRACE, row[0])])

    async def save_events(self, events: Sequence[Any]) -> None:
        """Persist many events in one statement; duplicates ignored exactly as in :meth:`save_event`."""
        with refusing("save_events"):
            rows = encode_events(list(events))
        try:
            await self._tables.events.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({(TRACE, row[0]) for row in rows})

    async def load_history(self, trace_id: str) -> list[Any]:
        """The trace's events by ascending ``ts``, ties in insertion order; ``[]`` for an unknown trace."""
        with refusing("load_history"):
            check_text(trace_id, "trace_id")
        if self._router is None:
            return await self._tables.events.load(trace_id)
        return await self._router.read(_scopes(TRACE, trace_id), lambda tables: tables.events.load(trace_id))

    # ------------------------------------------------------------------------------------------------
    # Remote bindings
    # ------------------------------------------------------------------------------------------------

    async def save_remote_binding(self, binding: Any) -> None:
        """Upsert the binding on ``(trace_id, context_id, task_id)``."""
        with refusing("save_remote_binding", "binding"):
            row = encode_binding(binding)
        try:
            await self._tables.bindings.save(row)
        finally:
            if self._router is not None and row[4] is not None:
                self._router.wrote([(ROUTER_SESSION, row[4])])

    async def save_remote_bindings(self, bindings: Sequence[Any]) -> None:
        """Upsert many bindings in one statement, as :meth:`save_remote_binding` for each in order."""
        with refusing("save_remote_bindings"):
            rows = encode_items(bindings, encode_binding, arity=1, shape="binding", name="bindings")
        try:
            await self._tables.bindings.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({(ROUTER_SESSION, row[4]) for row in rows if row[4] is not None})

    async def find_binding(
        self,
        *,
        router_session_id: str,
        agent_url: str,
        remote_skill: str,
        tenant_id: str | None = None,
        user_id: str | None = None,
    ) -> Any:
        """The most recently saved non-terminal binding with these coordinates, or ``None``."""
        with refusing("find_binding"):
            return await self._tables.bindings.find_binding(
                router_session_id=router_session_id,
                agent_url=agent_url,
                remote_skill=remote_skill,
                tenant_id=tenant_id,
                user_id=user_id,
            )

    async def list_bindings(self, *, router_session_id: str) -> list[Any]:
        """Every binding of a router session, in the order first saved."""
        with refusing("list_bindings"):
            if self._router is None:
                return await self._tables.bindings.list_bindings(router_session_id)
            return await self._router.read(
                (*_scopes(ROUTER_SESSION, router_session_id), EVERY_ROUTER_SESSION),
                lambda tables: tables.bindings.list_bindings(router_session_id),
            )

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        """Mark a binding terminal (never reused); a no-op for an unknown binding."""
        with refusing("mark_binding_terminal"):
            try:
                await self._tables.bindings.mark_terminal(
                    trace_id=trace_id, context_id=context_id, task_id=task_id
                )
            finally:
                if self._router is not None:
                    self._router.wrote([EVERY_ROUTER_SESSION])

    async def mark_bindings_terminal(self, items: Sequence[tuple[str, str | None, str]]) -> None:
        """Mark many ``(trace_id, context_id, task_id)`` bindings terminal in one statement, as
        :meth:`mark_binding_terminal` for each; unknown bindings are skipped."""
        with refusing("mark_bindings_terminal"):
            keys = encode_items(items, encode_binding_key, arity=3, shape="(trace_id, context_id, task_id)")
        try:
            await self._tables.bindings.mark_terminal_many(keys)
        finally:
            if self._router is not None:
                self._router.wrote([EVERY_ROUTER_SESSION])

    # ------------------------------------------------------------------------------------------------
    # Planner pause state and memory
    # ------------------------------------------------------------------------------------------------

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        """Upsert a pause payload, loadable for ``pause_ttl`` seconds."""
        with refusing("save_planner_state"):
            row = self._tables.pauses.encode(token, payload)
        await self._tables.pauses.save(*row)

    async def save_planner_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Upsert many ``(token, payload)`` pauses in one statement, as :meth:`save_planner_state`
        for each: each is loadable for ``pause_ttl`` seconds, a consumed token becomes loadable
        again, the last payload of a token wins."""
        with refusing("save_planner_states"):
            rows = encode_items(items, self._tables.pauses.encode, arity=2, shape="(token, payload)")
        await self._tables.pauses.save_many(rows)

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        """Consume the pause: its payload once, then ``None`` (a repeat with the same idempotency key
        within ``consume_grace`` seconds gets the payload again; a pause consumed within
        ``consume_grace`` seconds by one of the guard's unanswered keys is consumed again, once, by
        the current key)."""
        with refusing("load_planner_state"):
            return await self._tables.pauses.load(token)

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        """Upsert the memory state of ``key``."""
        with refusing("save_memory_state"):
            row = self._tables.memory.encode(key, state)
        await self._tables.memory.save(*row)

    async def save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Upsert many ``(key, state)`` pairs in one statement; the last state of a key wins."""
        with refusing("save_memory_states"):
            rows = encode_items(items, self._tables.memory.encode, arity=2, shape="(key, state)")
        await self._tables.memory.save_many(rows)

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        """The exact state saved for ``key``, or ``None``."""
        with refusing("load_memory_state"):
            return await self._tables.memory.load(key)

    async def list_memory_keys(self, session_id: str) -> list[str]:
        """Every memory key of the session, sorted: the keys ending with ``:{session_id}`` (spec
        003's ``tenant:user:session``)."""
        with refusing("list_memory_keys"):
            return await self._tables.memory.keys_of_session(session_id)

    # ------------------------------------------------------------------------------------------------
    # Tasks and updates
    # ------------------------------------------------------------------------------------------------

    async def save_task(self, state: Any) -> None:
        """Upsert a task unless the stored one has a newer ``updated_at`` (never goes backwards)."""
        with refusing("save_task", "state"):
            row = encode_task(state)
        try:
            saved = await self._tables.tasks.save(row)
        finally:
            if self._router is not None:
                self._router.wrote([(SESSION, row[0])])
        if not saved:
            self._stale_tasks_refused("save_task", 1)

    async def save_tasks(self, states: Sequence[Any]) -> None:
        """Upsert many tasks in one round trip, as :meth:`save_task` for each in order: a task never
        goes back to an older ``updated_at`` (within the list too: the newest wins, the later of
        equal ones)."""
        with refusing("save_tasks"):
            rows = encode_items(states, encode_task, arity=1, shape="state", name="states")
        try:
            refused = await self._tables.tasks.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({(SESSION, row[0]) for row in rows})
        if refused:
            self._stale_tasks_refused("save_tasks", refused)

    def _stale_tasks_refused(self, method: str, refused: int) -> None:
        """Log (DEBUG) task saves refused as older than the stored ones; a replay's are reported
        (:class:`~guarded.errors.WriteSupersededError`: the guard counts them as superseded)."""
        extra: dict[str, Any] = {"event": "guarded_pg_stale_task_refused", "schema": self.schema}
        extra["refused"] = refused
        logger.debug("guarded_pg_stale_task_refused", extra=extra)
        if REPLAYING.get():
            raise WriteSupersededError(refused, method=method)

    async def list_tasks(self, session_id: str) -> list[Any]:
        """Every task of the session; ``[]`` when none."""
        with refusing("list_tasks"):
            if self._router is None:
                return await self._tables.tasks.list(session_id)
            return await self._router.read(
                _scopes(SESSION, session_id), lambda tables: tables.tasks.list(session_id)
            )

    async def save_update(self, update: Any) -> None:
        """Append an update; idempotent by ``(session_id, update_id)``."""
        await self._save_update("save_update", update)

    async def _save_update(self, method: str, update: Any) -> None:
        with refusing(method, "update"):
            row = self._tables.updates.encode(update)
        try:
            await self._tables.updates.save(row)
        finally:
            if self._router is not None:
                self._router.wrote([(SESSION, row[0])])

    async def save_updates(self, updates: Sequence[Any]) -> None:
        """Append many updates in one statement, with :meth:`save_update`'s idempotency."""
        with refusing("save_updates"):
            rows = self._tables.updates.encode_many(list(updates))
        try:
            await self._tables.updates.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({(SESSION, row[0]) for row in rows})

    async def list_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> list[Any]:
        """Updates oldest first after the exclusive cursor ``since_id``; the ``limit`` most recent."""
        return await self._list_updates("list_updates", session_id, task_id, since_id, limit)

    async def _list_updates(
        self, method: str, session_id: str, task_id: str | None, since_id: str | None, limit: int
    ) -> list[Any]:
        with refusing(method):
            if self._router is None:
                return await self._tables.updates.list(
                    session_id, task_id=task_id, since_id=since_id, limit=limit
                )
            return await self._router.read(
                _scopes(SESSION, session_id),
                lambda tables: tables.updates.list(
                    session_id, task_id=task_id, since_id=since_id, limit=limit
                ),
            )

    async def save_task_update(self, update: Any) -> None:
        """Legacy alias of :meth:`save_update`."""
        await self._save_update("save_task_update", update)

    async def list_task_updates(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> list[Any]:
        """Legacy alias of :meth:`list_updates`."""
        return await self._list_updates("list_task_updates", session_id, task_id, since_id, limit)

    # ------------------------------------------------------------------------------------------------
    # Steering
    # ------------------------------------------------------------------------------------------------

    async def save_steering(self, event: Any) -> None:
        """Sanitize as PenguiFlow does, then append the sanitized form; idempotent by
        ``(session_id, event_id)``. No validation, as in PenguiFlow's reference (:mod:`guarded.steering`).
        """
        sanitized = sanitize_steering_event(event)
        with refusing("save_steering", "event"):
            row = self._tables.steering.encode(sanitized)
        try:
            await self._tables.steering.save(row)
        finally:
            if self._router is not None:
                self._router.wrote([(SESSION, row[0])])

    async def list_steering(
        self,
        session_id: str,
        *,
        task_id: str | None = None,
        since_id: str | None = None,
        limit: int = 500,
    ) -> list[Any]:
        """Steering events with :meth:`list_updates`' cursor rules."""
        with refusing("list_steering"):
            if self._router is None:
                return await self._tables.steering.list(
                    session_id, task_id=task_id, since_id=since_id, limit=limit
                )
            return await self._router.read(
                _scopes(SESSION, session_id),
                lambda tables: tables.steering.list(
                    session_id, task_id=task_id, since_id=since_id, limit=limit
                ),
            )

    # ------------------------------------------------------------------------------------------------
    # Trajectories
    # ------------------------------------------------------------------------------------------------

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Any) -> None:
        """Upsert the trajectory of ``(trace_id, session_id)``."""
        with refusing("save_trajectory"):
            row = self._tables.trajectories.encode(trace_id, session_id, trajectory)
        try:
            await self._tables.trajectories.save(row)
        finally:
            if self._router is not None:
                self._router.wrote([(TRACE, row[0]), (SESSION, row[1])])

    async def save_trajectories(self, items: Sequence[tuple[str, str, Any]]) -> None:
        """Upsert many ``(trace_id, session_id, trajectory)`` items in one statement, as
        :meth:`save_trajectory` for each in order (``list_traces`` order included)."""
        with refusing("save_trajectories"):
            rows = encode_items(
                items, self._tables.trajectories.encode, arity=3, shape="(trace_id, session_id, trajectory)"
            )
        try:
            await self._tables.trajectories.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({scope for row in rows for scope in ((TRACE, row[0]), (SESSION, row[1]))})

    async def get_trajectory(self, trace_id: str, session_id: str) -> Any:
        """The trajectory, or ``None`` when missing or saved under another session."""
        with refusing("get_trajectory"):
            if self._router is None:
                return await self._tables.trajectories.get(trace_id, session_id)
            return await self._router.read(
                _scopes(TRACE, trace_id), lambda tables: tables.trajectories.get(trace_id, session_id)
            )

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        """Trace ids of the session, most recently saved first."""
        with refusing("list_traces"):
            if self._router is None:
                return await self._tables.trajectories.list_traces(session_id, limit)
            return await self._router.read(
                _scopes(SESSION, session_id),
                lambda tables: tables.trajectories.list_traces(session_id, limit),
            )

    # ------------------------------------------------------------------------------------------------
    # Planner events
    # ------------------------------------------------------------------------------------------------

    async def save_planner_event(self, trace_id: str, event: Any) -> None:
        """Append a planner event (a retry under the same idempotency key is not appended twice)."""
        with refusing("save_planner_event"):
            row = encode_planner_event(trace_id, event, call_keys(1)[0])
        try:
            await self._tables.planner_events.save_many([row])
        finally:
            if self._router is not None:
                self._router.wrote([(TRACE, row[0])])

    async def save_planner_events(self, items: Sequence[tuple[str, Any]]) -> None:
        """Append many ``(trace_id, event)`` pairs in one statement, in order."""
        with refusing("save_planner_events"):
            rows = encode_planner_events(items)
        try:
            await self._tables.planner_events.save_many(rows)
        finally:
            if self._router is not None:
                self._router.wrote({(TRACE, row[0]) for row in rows})

    async def list_planner_events(self, trace_id: str) -> list[Any]:
        """Planner events of a trace in emission order."""
        with refusing("list_planner_events"):
            return await self._list_planner_events(trace_id)

    async def get_events(self, trace_id: str) -> list[Any]:
        """Legacy alias of :meth:`list_planner_events`."""
        with refusing("get_events"):
            return await self._list_planner_events(trace_id)

    async def _list_planner_events(self, trace_id: str) -> list[Any]:
        if self._router is None:
            return await self._tables.planner_events.list(trace_id)
        return await self._router.read(
            _scopes(TRACE, trace_id), lambda tables: tables.planner_events.list(trace_id)
        )


def _scopes(kind: str, value: Any) -> tuple[ReadScope, ...]:
    """The scope a read of ``value`` shows, its id as stored (a value that is no string is refused by
    the read itself, wherever it goes)."""
    return ((kind, to_db_text(value) if isinstance(value, str) else ""),)


__all__ = ["ProtocolMethods"]
