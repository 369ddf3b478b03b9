"""``PostgresStateStore``: the whole StateStore protocol on PostgreSQL (asyncpg).

Lifecycle::

    store = await PostgresStateStore.connect(dsn, schema="tenant_a")     # pool + migrations
    store = await PostgresStateStore.from_pool(app_pool, schema="tenant_a")  # your pool
    store = PostgresStateStore.lazy(dsn)          # sync: the pool opens on first use
    async with await PostgresStateStore.connect(dsn) as store: ...
    await store.close()

Every method validates its arguments before any I/O: values that can never be stored raise
:class:`~guarded.errors.InvalidPayloadError` (non-retryable) naming the method and the field
path.

Bulk forms write many calls of a method in one round trip: ``save_events``, ``save_updates``,
``save_planner_events`` (appends) and ``save_memory_states``, ``save_tasks``,
``save_trajectories``, ``save_remote_bindings``, ``mark_bindings_terminal``,
``save_planner_states`` (upserts). Each takes one list -- for a single-parameter method each item
is that argument, else the tuple of the single method's parameters in signature order -- and
leaves what the single method called once per item in list order would leave (the last item of
a key wins). One bad item raises the single method's error, with the item's index in the path,
before anything is written.

Everything else a method raises comes from the database (connection loss, timeouts) and is for
the guard's retry / circuit-breaker / dead-letter layers to handle: this is a plain store that
may throw, ``guard()`` makes it safe.

Record types returned are PenguiFlow's own classes when ``penguiflow`` is installed, else
guarded's models (:func:`guarded.codec.installed_types`); pass ``types=`` to choose.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import asyncpg

from guarded.codec import installed_types
from guarded.steering import sanitize_steering_event

from . import migrations as migrations_module
from .artifacts import PostgresArtifactStore
from .bindings import encode_binding, encode_binding_key
from .bulk import encode_items
from .connection import Database, PoolSettings, create_pool, pool_settings
from .errors import POSTGRES_ERRORS
from .events import encode_event, encode_events
from .json_codec import check_text, refusing
from .lifecycle import Lifecycle, server_target
from .metrics import StoreMetrics
from .options import (
    DEFAULT_CONSUME_GRACE_SECONDS,
    DEFAULT_PAUSE_TTL_SECONDS,
    DEFAULT_STATS_INTERVAL_SECONDS,
    RetentionPolicy,
    StoreOptions,
    check_options,
    check_seconds,
)
from .planner_events import call_keys, encode_planner_event, encode_planner_events
from .retention import CleanupReport, cleanup
from .schema_names import validate_schema_name
from .tables import Tables
from .target import target_identity
from .tasks import encode_task

logger = logging.getLogger("guarded.backends.postgres")


class PostgresStateStore:
    """A production StateStore on PostgreSQL; every capability of the protocol, one schema per tenant."""

    def __init__(
        self, db: Database, *, schema: str, owns_pool: bool, **options: Unpack[StoreOptions]
    ) -> None:
        """Use :meth:`connect`, :meth:`from_pool` or :meth:`lazy` rather than this constructor."""
        self.schema = validate_schema_name(schema)
        self.name = options.get("name", "postgres")
        self.types = options.get("types") or installed_types()
        self.pause_ttl = check_seconds("pause_ttl", options.get("pause_ttl", DEFAULT_PAUSE_TTL_SECONDS))
        self.consume_grace = check_seconds(
            "consume_grace", options.get("consume_grace", DEFAULT_CONSUME_GRACE_SECONDS), allow_zero=True
        )
        self.retention = options.get("retention") or RetentionPolicy()
        interval = options.get("stats_interval", DEFAULT_STATS_INTERVAL_SECONDS)
        stats_interval = None if interval is None else check_seconds("stats_interval", interval)
        self._db = db
        self._metrics: StoreMetrics | None = None
        if options.get("metrics", True):
            self._metrics = StoreMetrics(
                store=self.name,
                schema=self.schema,
                registry=options.get("registry"),
                pool_size=db.pool_size,
                pool_max_size=db.pool_max_size,
                pool_in_use=db.pool_in_use,
            )
        db.metrics = self._metrics
        self._tables = Tables.of(
            db,
            self.schema,
            self.types,
            pause_ttl=self.pause_ttl,
            consume_grace=self.consume_grace,
            artifact_retention=options.get("artifact_retention"),
        )
        self.max_concurrency: int | None = db.pool_max_size() or None
        """How many calls this store runs at once: its pool's maximum size (a lazy store's from its
        pool settings). The guard's bulkhead reads it (:data:`guarded.pipeline.bulkhead.MAX_CONCURRENCY`)
        and lets that many calls in at a time, so callers wait in the guard's line rather than
        for a connection, and that wait never counts as the database being slow. On a pool the
        application shares, set ``GuardConfig.bulkhead.max_concurrent`` to this store's share."""
        self._lifecycle = Lifecycle(
            db,
            self.schema,
            name=self.name,
            migrate=options.get("migrate", True),
            metrics=self._metrics,
            stats_interval=stats_interval,
            owns_pool=owns_pool,
        )
        self.target_identity = f"postgresql://(application pool)/?schema={self.schema}"
        """Which database and schema this store writes to, without credentials (recorded by the
        guard's spill file so held writes are replayed only here); set from the DSN by
        :meth:`connect` and :meth:`lazy`, from the server by :meth:`from_pool`."""

    # ------------------------------------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        schema: str = "public",
        pool: PoolSettings | Mapping[str, Any] | None = None,
        **options: Unpack[StoreOptions],
    ) -> Self:
        """Create a pool for ``dsn``, apply migrations to ``schema`` and return a ready store.

        ``dsn`` ``None`` lets asyncpg read the standard ``PG*`` environment variables.
        ``pool`` sets the pool size, ``command_timeout``, server ``statement_timeout`` and
        connection setup (see :class:`~.connection.PoolSettings`).
        """
        validate_schema_name(schema)
        check_options("PostgresStateStore.connect()", options, StoreOptions.__optional_keys__)
        settings = pool_settings("PostgresStateStore.connect()", pool)
        created = await create_pool(dsn, settings)
        try:
            store = cls(Database(created), schema=schema, owns_pool=True, **options)
        except BaseException:
            await created.close()
            raise
        store.target_identity = target_identity(dsn, store.schema)
        try:
            await store._opened()
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    async def from_pool(
        cls, pool: asyncpg.Pool, *, schema: str = "public", **options: Unpack[StoreOptions]
    ) -> Self:
        """A store on an application-owned pool (not closed by :meth:`close`); migrations applied."""
        check_options("PostgresStateStore.from_pool()", options, StoreOptions.__optional_keys__)
        store = cls(Database(pool), schema=schema, owns_pool=False, **options)
        try:
            await store._opened()
            target = await server_target(pool, store.schema)
            if target is not None:
                store.target_identity = target
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    def lazy(
        cls,
        dsn: str | None = None,
        *,
        schema: str = "public",
        pool: PoolSettings | Mapping[str, Any] | None = None,
        **options: Unpack[StoreOptions],
    ) -> Self:
        """A store built synchronously whose pool (and migrations) open on the first call."""
        check_options("PostgresStateStore.lazy()", options, StoreOptions.__optional_keys__)
        settings = pool_settings("PostgresStateStore.lazy()", pool)
        holder: list[PostgresStateStore] = []

        async def opener() -> asyncpg.Pool:
            created = await create_pool(dsn, settings)
            try:
                await holder[0]._lifecycle.prepare_schema(created)
            except BaseException:
                await created.close()
                raise
            holder[0]._lifecycle.start_sampler()
            return created

        store = cls(Database(opener=opener), schema=validate_schema_name(schema), owns_pool=True, **options)
        store.target_identity = target_identity(dsn, store.schema)
        store.max_concurrency = settings.max_size
        holder.append(store)
        return store

    async def _opened(self) -> None:
        await self._lifecycle.open()

    @property
    def schema_version(self) -> int | None:
        """The schema's migration version once opened (``None`` before)."""
        return self._lifecycle.schema_version

    async def sample_table_stats(self) -> dict[str, tuple[int, int]]:
        """Sample ``{table: (estimated rows, bytes)}`` now and update the metrics."""
        return await self._lifecycle.sample_table_stats()

    async def close(self) -> None:
        """Stop background sampling, drop this store's metrics and close the pool when the store owns it."""
        await self._lifecycle.close()

    async def __aenter__(self) -> Self:
        if not self._db.is_open:
            await self._db.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def pool(self) -> asyncpg.Pool:
        """The asyncpg pool (for ops tooling; the store does not expect others to use its schema)."""
        return self._db.pool

    async def migration_status(self) -> migrations_module.MigrationStatus:
        """Where the schema stands relative to the migrations shipped with this code."""
        async with self._db.acquire() as conn:
            return await migrations_module.status(conn, self.schema)

    async def cleanup(self) -> CleanupReport:
        """Delete expired pauses and artifacts and enforce the configured retention; report rows deleted."""
        report = await cleanup(self._db, self.schema, grace=self.consume_grace, policy=self.retention)
        if self._metrics is not None:
            for table, rows in report.deleted.items():
                self._metrics.cleanup_deleted(table, rows)
        return report

    def __repr__(self) -> str:
        return f"PostgresStateStore(name={self.name!r}, schema={self.schema!r})"

    # ------------------------------------------------------------------------------------------------
    # Core audit log
    # ------------------------------------------------------------------------------------------------

    async def save_event(self, event: Any) -> None:
        """Persist a runtime event; idempotent by the event's fingerprint."""
        with refusing("save_event", "event"):
            row = encode_event(event)
        await self._tables.events.save(row)

    async def save_events(self, events: Sequence[Any]) -> None:
        """Persist many events in one statement; duplicates ignored exactly as in :meth:`save_event`."""
        with refusing("save_events"):
            rows = encode_events(list(events))
        await self._tables.events.save_many(rows)

    async def load_history(self, trace_id: str) -> list[Any]:
        """The trace's events by ascending ``ts``, ties in insertion order; ``[]`` for an unknown trace."""
        with refusing("load_history"):
            check_text(trace_id, "trace_id")
        return await self._tables.events.load(trace_id)

    # ------------------------------------------------------------------------------------------------
    # Remote bindings
    # ------------------------------------------------------------------------------------------------

    async def save_remote_binding(self, binding: Any) -> None:
        """Upsert the binding on ``(trace_id, context_id, task_id)``."""
        with refusing("save_remote_binding", "binding"):
            row = encode_binding(binding)
        await self._tables.bindings.save(row)

    async def save_remote_bindings(self, bindings: Sequence[Any]) -> None:
        """Upsert many bindings in one statement, as :meth:`save_remote_binding` for each in order."""
        with refusing("save_remote_bindings"):
            rows = encode_items(bindings, encode_binding, arity=1, shape="binding", name="bindings")
        await self._tables.bindings.save_many(rows)

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
            return await self._tables.bindings.list_bindings(router_session_id)

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        """Mark a binding terminal (never reused); a no-op for an unknown binding."""
        with refusing("mark_binding_terminal"):
            await self._tables.bindings.mark_terminal(
                trace_id=trace_id, context_id=context_id, task_id=task_id
            )

    async def mark_bindings_terminal(self, items: Sequence[tuple[str, str | None, str]]) -> None:
        """Mark many ``(trace_id, context_id, task_id)`` bindings terminal in one statement, as
        :meth:`mark_binding_terminal` for each; unknown bindings are skipped."""
        with refusing("mark_bindings_terminal"):
            keys = encode_items(items, encode_binding_key, arity=3, shape="(trace_id, context_id, task_id)")
        await self._tables.bindings.mark_terminal_many(keys)

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

    honours_idempotency_key = True
    """A consume is safe to retry under one idempotency key: the guard retries it."""
    error_classifier = POSTGRES_ERRORS
    """How the guard classifies this store's errors (:mod:`.errors`: SQLSTATEs)."""
    recovers_unanswered_consumes = True
    """A consume recovers a pause consumed by a key whose answer was lost (see :mod:`.pauses`)."""

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

    # ------------------------------------------------------------------------------------------------
    # Tasks and updates
    # ------------------------------------------------------------------------------------------------

    async def save_task(self, state: Any) -> None:
        """Upsert a task unless the stored one has a newer ``updated_at`` (never goes backwards)."""
        with refusing("save_task", "state"):
            row = encode_task(state)
        if not await self._tables.tasks.save(row):
            self._stale_tasks_refused(None)

    async def save_tasks(self, states: Sequence[Any]) -> None:
        """Upsert many tasks in one round trip, as :meth:`save_task` for each in order: a task never
        goes back to an older ``updated_at`` (within the list too: the newest wins, the later of
        equal ones)."""
        with refusing("save_tasks"):
            rows = encode_items(states, encode_task, arity=1, shape="state", name="states")
        refused = await self._tables.tasks.save_many(rows)
        if refused:
            self._stale_tasks_refused(refused)

    def _stale_tasks_refused(self, refused: int | None) -> None:
        """Log (DEBUG) task saves refused as older than the stored ones (``None``: one, uncounted)."""
        extra: dict[str, Any] = {"event": "guarded_pg_stale_task_refused", "schema": self.schema}
        if refused is not None:
            extra["refused"] = refused
        logger.debug("guarded_pg_stale_task_refused", extra=extra)

    async def list_tasks(self, session_id: str) -> list[Any]:
        """Every task of the session; ``[]`` when none."""
        with refusing("list_tasks"):
            return await self._tables.tasks.list(session_id)

    async def save_update(self, update: Any) -> None:
        """Append an update; idempotent by ``(session_id, update_id)``."""
        await self._save_update("save_update", update)

    async def _save_update(self, method: str, update: Any) -> None:
        with refusing(method, "update"):
            row = self._tables.updates.encode(update)
        await self._tables.updates.save(row)

    async def save_updates(self, updates: Sequence[Any]) -> None:
        """Append many updates in one statement, with :meth:`save_update`'s idempotency."""
        with refusing("save_updates"):
            rows = self._tables.updates.encode_many(list(updates))
        await self._tables.updates.save_many(rows)

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
            return await self._tables.updates.list(
                session_id, task_id=task_id, since_id=since_id, limit=limit
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
        await self._tables.steering.save(row)

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
            return await self._tables.steering.list(
                session_id, task_id=task_id, since_id=since_id, limit=limit
            )

    # ------------------------------------------------------------------------------------------------
    # Trajectories
    # ------------------------------------------------------------------------------------------------

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Any) -> None:
        """Upsert the trajectory of ``(trace_id, session_id)``."""
        with refusing("save_trajectory"):
            row = self._tables.trajectories.encode(trace_id, session_id, trajectory)
        await self._tables.trajectories.save(row)

    async def save_trajectories(self, items: Sequence[tuple[str, str, Any]]) -> None:
        """Upsert many ``(trace_id, session_id, trajectory)`` items in one statement, as
        :meth:`save_trajectory` for each in order (``list_traces`` order included)."""
        with refusing("save_trajectories"):
            rows = encode_items(
                items, self._tables.trajectories.encode, arity=3, shape="(trace_id, session_id, trajectory)"
            )
        await self._tables.trajectories.save_many(rows)

    async def get_trajectory(self, trace_id: str, session_id: str) -> Any:
        """The trajectory, or ``None`` when missing or saved under another session."""
        with refusing("get_trajectory"):
            return await self._tables.trajectories.get(trace_id, session_id)

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        """Trace ids of the session, most recently saved first."""
        with refusing("list_traces"):
            return await self._tables.trajectories.list_traces(session_id, limit)

    # ------------------------------------------------------------------------------------------------
    # Planner events
    # ------------------------------------------------------------------------------------------------

    async def save_planner_event(self, trace_id: str, event: Any) -> None:
        """Append a planner event (a retry under the same idempotency key is not appended twice)."""
        with refusing("save_planner_event"):
            row = encode_planner_event(trace_id, event, call_keys(1)[0])
        await self._tables.planner_events.save_many([row])

    async def save_planner_events(self, items: Sequence[tuple[str, Any]]) -> None:
        """Append many ``(trace_id, event)`` pairs in one statement, in order."""
        with refusing("save_planner_events"):
            rows = encode_planner_events(items)
        await self._tables.planner_events.save_many(rows)

    async def list_planner_events(self, trace_id: str) -> list[Any]:
        """Planner events of a trace in emission order."""
        with refusing("list_planner_events"):
            return await self._tables.planner_events.list(trace_id)

    async def get_events(self, trace_id: str) -> list[Any]:
        """Legacy alias of :meth:`list_planner_events`."""
        with refusing("get_events"):
            return await self._tables.planner_events.list(trace_id)

    # ------------------------------------------------------------------------------------------------
    # Artifacts
    # ------------------------------------------------------------------------------------------------

    @property
    def artifact_store(self) -> PostgresArtifactStore:
        """Artifacts in this store's schema, with the configured retention."""
        return self._tables.artifacts


__all__ = ["PostgresStateStore", "StoreOptions"]
