"""The connection pool and how every statement reaches it.

:func:`create_pool` builds an asyncpg pool with the store's settings (size, ``command_timeout``,
a server-side ``statement_timeout``, a per-connection ``init`` hook). :class:`Database` runs
operations on it: it times pool acquisition for the metrics and recovers from lost connections.

**Recovering the pool.** After a database restart or failover every idle pool connection is
dead. asyncpg replaces a connection it already knows is closed when it is acquired; one whose
death is noticed only by the statement fails with a connection error. :meth:`Database.run`
then expires the pool's connections (so the other dead ones are replaced, not tried in turn)
and runs the operation once more on a fresh connection -- for operations that are safe to
repeat, which is every operation of this backend except the two that could act twice without an
idempotency key: a pause consume and a planner-event append. Anything else (and a second
failure) propagates: the guard's retry layer handles outages that last.

**Releasing a connection.** asyncpg resets every connection it takes back (advisory unlock,
``CLOSE ALL``, ``UNLISTEN``, ``RESET ALL``): one more round trip per statement, about a third of a
single write's time. The store's own statements leave no session state behind (a transaction is
committed or rolled back, a lock is transaction-scoped), so a connection that ran one to its end is
only rolled back if a transaction is open (asyncpg does that on every release) and given back.
Any other release -- a statement cancelled or failed, a migration (which sets session state), a
connection borrowed from :attr:`PostgresStateStore.pool` by the application -- gets asyncpg's full
reset, as before. A release that sends nothing at all runs in place (:func:`release`) rather than
in the task of its own that ``Pool.release()`` starts for every release.

**Behind a transaction pooler** (``PoolSettings.pooler="transaction"``, see :mod:`.pooler`) the
pool sends no ``statement_timeout`` start-up parameter and prepares no named statements (each
statement is described once per connection and then sent unnamed in one round trip, see
:mod:`.statement_descriptions`); every operation runs in a transaction of its own that starts with
``SET LOCAL statement_timeout`` -- unless the server connections' own default already cancels
within the store's timeout (checked once, on the first operation), and then the operation is its
statements alone. A released connection gets no reset at all (asyncpg's rollback of an open
transaction aside). In either mode an error that shows the settings do not suit the pooler in
front of the server is raised as a :class:`~.pooler.PoolerMismatchError` naming the setting to
change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from guarded.backend import PoolUsage

from .database_metrics import StoreMetrics
from .options import check_options
from .pooler import (
    SERVER_DEFAULT_TIMEOUT,
    TRANSACTION,
    begin_statement,
    check_pooler,
    explain_pooler_error,
    server_timeout_suffices,
)
from .statement_descriptions import DescribedStatementConnection

T = TypeVar("T")

logger = logging.getLogger("guarded.backends.postgres")

Connection = asyncpg.Connection | PoolConnectionProxy
"""What operations receive: a pooled connection."""

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # class 08: connection does not exist / failure
    asyncpg.exceptions.AdminShutdownError,  # 57P01: server shut down / restarted
    asyncpg.exceptions.CrashShutdownError,  # 57P02
    asyncpg.exceptions.CannotConnectNowError,  # 57P03: starting up / shutting down
    ConnectionError,  # reset, refused, broken pipe
)
"""Errors that mean the connection, not the statement, failed."""


MANY_ROWS = 1000
"""An answer of this many rows or more is let go of before the operation returns (see
:meth:`Database.run`); a smaller one when the caller next waits."""


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection was lost (the statement may not have run)."""
    if isinstance(exc, CONNECTION_ERRORS):
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc)
        return "connection is closed" in text or "connection was closed" in text
    return False


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How :func:`create_pool` builds the pool (every field has a production default).

    ``statement_timeout`` is enforced by the server (it cancels a runaway statement even when
    the client is gone); ``command_timeout`` by asyncpg on the client. Both in seconds,
    ``None`` to disable. ``server_settings`` are extra PostgreSQL settings for every connection;
    ``init`` runs on each new connection (for type codecs, ``SET`` commands, ...).
    ``pooler`` is ``"transaction"`` behind a connection pooler in transaction mode (PgBouncer,
    RDS Proxy, Supavisor): the store then keeps no state in a session (see :mod:`.pooler`);
    ``None`` (or ``"session"``) for a direct connection or a pooler in session mode.
    """

    min_size: int = 2
    max_size: int = 10
    command_timeout: float | None = 10.0
    statement_timeout: float | None = 30.0
    connect_timeout: float = 10.0
    max_inactive_connection_lifetime: float = 300.0
    application_name: str = "guarded"
    server_settings: Mapping[str, str] = field(default_factory=dict)
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further keyword arguments for ``asyncpg.create_pool`` (``ssl``, ``statement_cache_size``...)."""
    pooler: str | None = None

    def __post_init__(self) -> None:
        check_pooler(self.pooler, "PoolSettings.pooler")

    @property
    def transaction_pooled(self) -> bool:
        """Whether the pool sits behind a connection pooler in transaction mode."""
        return check_pooler(self.pooler) == TRANSACTION


def pool_settings(caller: str, pool: PoolSettings | Mapping[str, Any] | None) -> PoolSettings:
    """``pool=`` as given to ``caller`` (``"Store.connect()"``): a :class:`PoolSettings`, a
    mapping of its fields (``{"max_size": 5}``), or ``None`` for the defaults; anything else is a
    ``TypeError`` that says what is expected."""
    if pool is None:
        return PoolSettings()
    if isinstance(pool, PoolSettings):
        return pool
    fields = [item.name for item in dataclasses.fields(PoolSettings)]
    if isinstance(pool, Mapping):
        check_options(f"{caller} pool=", pool, fields)
        return PoolSettings(**pool)
    raise TypeError(
        f"{caller} pool= takes a PoolSettings or a mapping of its fields ({', '.join(fields)}), "
        f"got {type(pool).__name__}"
    )


def with_pooler(settings: PoolSettings, pooler: str | None) -> PoolSettings:
    """``settings`` with ``pooler`` in force when given (``connect(..., pooler=...)``)."""
    if pooler is None:
        return settings
    return dataclasses.replace(settings, pooler=check_pooler(pooler))


async def create_pool(dsn: str | None, settings: PoolSettings) -> asyncpg.Pool:
    """An asyncpg pool for ``dsn`` configured by ``settings``; a :class:`~.pooler.PoolerMismatchError`
    when a pooler in front of the server refuses them."""
    server_settings = {"application_name": settings.application_name}
    transaction_pooled = settings.transaction_pooled
    if settings.statement_timeout is not None and not transaction_pooled:
        server_settings["statement_timeout"] = str(int(settings.statement_timeout * 1000))
    server_settings.update(settings.server_settings)
    options: dict[str, Any] = {
        "min_size": settings.min_size,
        "max_size": settings.max_size,
        "command_timeout": settings.command_timeout,
        "timeout": settings.connect_timeout,
        "max_inactive_connection_lifetime": settings.max_inactive_connection_lifetime,
        "server_settings": server_settings,
    }
    if settings.init is not None:
        options["init"] = settings.init
    if transaction_pooled:
        options["statement_cache_size"] = 0
        options["reset"] = keep_session
        if "connection_class" not in settings.extra:
            options["connection_class"] = DescribedStatementConnection
    elif "connection_class" not in settings.extra and "reset" not in settings.extra:
        options["connection_class"] = StoreConnection
        options["reset"] = reset_session
    options.update(settings.extra)
    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(dsn, **options)
    except Exception as exc:
        mismatch = explain_pooler_error(exc)
        if mismatch is not None:
            raise mismatch from exc
        raise
    return pool


class StoreConnection(asyncpg.Connection):
    """A pooled connection that can be vouched free of session state until it is released."""

    __slots__ = ("_session_clean",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session_clean = False

    def vouch_session_clean(self) -> None:
        """This connection's last user ran only statements that leave no session state."""
        self._session_clean = True

    @property
    def session_clean(self) -> bool:
        """Whether the connection was vouched clean since it was acquired."""
        return self._session_clean

    def take_session_clean(self) -> bool:
        """Whether the connection was vouched clean since it was acquired (and forget it)."""
        clean, self._session_clean = self._session_clean, False
        return clean


async def reset_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: asyncpg's full reset query unless the connection was vouched
    free of session state (asyncpg has already rolled back an open transaction either way)."""
    if isinstance(conn, StoreConnection) and conn.take_session_clean():
        return
    query = conn.get_reset_query()
    if query:
        await conn.execute(query)


async def keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release behind a transaction pooler: nothing. asyncpg has rolled back
    an open transaction; any session command would run on whichever server connection the pooler
    lends next -- another client's session state, not this one's."""


def transaction(conn: Connection) -> contextlib.AbstractAsyncContextManager[Any]:
    """``conn.transaction()`` for an operation's statements that must commit together; nothing new
    when the operation already runs in a transaction of its own (behind a transaction pooler)."""
    if conn.is_in_transaction():
        return contextlib.nullcontext()
    return conn.transaction()


def one_transaction(db: Database, conn: Connection) -> contextlib.AbstractAsyncContextManager[Any]:
    """For an operation of several statements: behind a transaction pooler they must share one
    transaction (each statement could otherwise run on another server connection), which
    :func:`transaction` opens unless the operation already runs in one of its own; on a direct
    connection nothing (the statements share the connection)."""
    if db.transaction_pooled:
        return transaction(conn)
    return contextlib.nullcontext()


def _release_needs_no_io(pool: Any, conn: Any) -> bool:
    """Whether asyncpg's release of ``conn`` would send nothing and wait for nothing: the same
    connection generation, under its query limit, no cancellation or transaction to wait for or roll
    back, a reset on release that sends nothing (behind a transaction pooler, or vouched clean),
    and no query logger (asyncpg tells loggers in callbacks the loop runs after the statement: the
    usual release lets the loop turn, so they have run when the call returns).

    The private attributes read here are those of asyncpg 0.30.0, 0.31.0 and 0.32.0 (each checked
    with tests/postgres/test_release_in_place.py). An asyncpg without one of them is answered
    ``False``: its connections are released by ``Pool.release()``, the usual way."""
    try:
        con = conn._con
        holder = conn._holder
        reset = pool._reset
        protocol = con._protocol
        return (
            (reset is keep_session or (reset is reset_session and con.session_clean))
            and holder._generation == pool._generation
            and protocol.queries_count < holder._max_queries
            and not protocol._is_cancelling()
            and not protocol.is_in_transaction()
            and con._top_xact is None
            and not con._query_loggers
            and not con.is_closed()
            and not pool.is_closing()
        )
    except AttributeError:  # an asyncpg whose pool works otherwise: release it the usual way
        return False


async def release(pool: asyncpg.Pool, conn: Any) -> None:
    """Give ``conn`` back to ``pool``, without a task of its own when nothing is sent.

    ``Pool.release()`` runs the release in a task behind ``asyncio.shield()`` (so a cancelled
    caller cannot leave a reset half done): two more turns of the event loop per call, about a
    tenth of a direct statement's time. When the release sends nothing and waits for nothing
    (:func:`_release_needs_no_io`) there is nothing for a cancellation to interrupt, and the holder's
    own release runs in place -- the same code, the same bookkeeping (listeners checked, the proxy
    detached, the idle timer armed, the holder queued)."""
    if _release_needs_no_io(pool, conn):
        holder = conn._holder
        conn._con._on_release()
        await holder.release(holder._timeout)
        return
    await pool.release(conn)


def _vouch_clean(conn: Connection) -> None:
    vouch = getattr(conn, "vouch_session_clean", None)  # absent on an application's own pool
    if vouch is not None:
        vouch()


class Database:
    """Runs operations on a pool: timed acquisition, recovery from lost connections.

    The pool may be opened lazily: with ``opener`` and no ``pool``, the first operation opens it.
    """

    def __init__(
        self,
        pool: asyncpg.Pool | None = None,
        *,
        opener: Callable[[], Awaitable[asyncpg.Pool]] | None = None,
        metrics: StoreMetrics | None = None,
        settings: PoolSettings | None = None,
    ) -> None:
        """``settings`` are the pool's when this database created it (``None``: an application's
        pool, taken as a direct connection's)."""
        if pool is None and opener is None:
            raise ValueError("Database needs a pool or an opener")
        self._pool = pool
        self.transaction_pooled = settings is not None and settings.transaction_pooled
        """Whether the pool sits behind a connection pooler in transaction mode."""
        self._begin = (
            begin_statement(settings.statement_timeout)
            if settings is not None and settings.transaction_pooled
            else None
        )
        self._timeout_known = self._begin is None
        """Whether how ``statement_timeout`` is enforced is settled (:meth:`_learn_server_timeout`)."""
        self._statement_timeout = settings.statement_timeout if settings is not None else None
        self._opener = opener
        self._open_lock = asyncio.Lock()
        self.metrics = metrics
        self._releasing: set[asyncio.Future[None]] = set()
        """Releases left to finish on their own (see :meth:`acquire`)."""

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool (raises when a lazy database was never opened)."""
        if self._pool is None:
            raise RuntimeError("the database pool is not open yet")
        return self._pool

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(self) -> asyncpg.Pool:
        """The pool, opening it first when this database is lazy."""
        if self._pool is not None:
            return self._pool
        async with self._open_lock:
            if self._pool is None:
                assert self._opener is not None
                self._pool = await self._opener()
            return self._pool

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        """A pooled connection; the wait is recorded in the acquire histogram."""
        pool = self._pool if self._pool is not None else await self.open()
        started = time.perf_counter()
        conn = await pool.acquire()
        try:
            if self.metrics is not None:
                self.metrics.observe_acquire(time.perf_counter() - started)
            yield conn
        except (asyncio.CancelledError, TimeoutError):
            # A statement interrupted by a cancellation (the guard's deadline) or asyncpg's own
            # timeout: asyncpg cancels it on the server through a new connection, and releasing
            # the connection waits for that (up to ``command_timeout``) -- forever as far as the
            # caller is concerned when the server accepts connections but never answers. The
            # release is left to run on its own (asyncpg shields it) and the caller goes on.
            self._release_later(pool, conn)
            raise
        except BaseException:
            await pool.release(conn)
            raise
        else:
            await release(pool, conn)

    def _release_later(self, pool: asyncpg.Pool, conn: PoolConnectionProxy[Any]) -> None:
        """Release ``conn`` in a task of its own (kept referenced until it ends)."""
        task = asyncio.ensure_future(pool.release(conn))
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Future[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed release is asyncpg's to log, not the caller's

    async def run(self, operation: Callable[[Connection], Awaitable[T]], *, repeat_safe: bool = True) -> T:
        """Run ``operation(conn)``; once more on a fresh connection if the first one was dead."""
        try:
            return await self._run_once(operation)
        except Exception as exc:
            mismatch = explain_pooler_error(exc)
            if mismatch is not None:
                if self.metrics is not None:
                    self.metrics.pooler_error(mismatch.kind)
                raise mismatch from exc
            if not is_connection_error(exc):
                raise
            if self.metrics is not None:
                self.metrics.connection_error()
            # A lazy pool that could not open has no connection to expire: the caller sees the
            # connection error itself (retryable), not "the pool is not open yet".
            if not repeat_safe or self._pool is None or self._pool.is_closing():
                raise
        await self._expire()
        return await self._run_once(operation)

    async def _run_once(self, operation: Callable[[Connection], Awaitable[T]]) -> T:
        # acquire() written out: the context manager's generator costs a few µs on every call.
        pool = self._pool if self._pool is not None else await self.open()
        if not self._timeout_known:
            await self._learn_server_timeout(pool)
        started = time.perf_counter()
        conn = await pool.acquire()
        try:
            if self.metrics is not None:
                self.metrics.observe_acquire(time.perf_counter() - started)
            if self._begin is not None:
                result = await self._in_transaction(conn, self._begin, operation)
            else:
                result = await operation(conn)
                _vouch_clean(conn)  # it ran to its end: no session state left behind
        except (asyncio.CancelledError, TimeoutError):
            self._release_later(pool, conn)  # as in acquire()
            raise
        except BaseException:
            await pool.release(conn)
            raise
        await release(pool, conn)
        if isinstance(result, list) and len(result) >= MANY_ROWS:
            # The rows asyncpg answered with stay referenced by the event loop's callback that runs
            # this task until it next waits (a release in place does not): let go of them now.
            await asyncio.sleep(0)
        return result

    @property
    def wraps_operations(self) -> bool:
        """Whether each operation runs in a transaction of its own that sets the statement timeout
        (behind a transaction pooler, until the server is known to enforce the timeout itself)."""
        return self._begin is not None

    async def _learn_server_timeout(self, pool: asyncpg.Pool) -> None:
        """Behind a transaction pooler, once: when the server connections' own default (the role's,
        the database's or the server's ``statement_timeout``) already cancels a statement within the
        store's ``statement_timeout``, operations need no transaction of their own to set it -- two
        round trips less per call. Otherwise each operation keeps its ``BEGIN; SET LOCAL``."""
        conn = await pool.acquire()
        try:
            default = await conn.fetchval(SERVER_DEFAULT_TIMEOUT)
        finally:
            await release(pool, conn)
        if server_timeout_suffices(default, self._statement_timeout):
            self._begin = None
        else:
            logger.info(
                "behind a transaction pooler each operation sets statement_timeout in a transaction "
                "of its own (two more round trips per call): the server's default is %s ms; set the "
                "role's or database's statement_timeout to at most %s ms to save them",
                default,
                int((self._statement_timeout or 0) * 1000),
            )
        self._timeout_known = True

    @staticmethod
    async def _in_transaction(
        conn: Connection, begin: str, operation: Callable[[Connection], Awaitable[T]]
    ) -> T:
        """``operation`` in a transaction that ``begin`` starts (behind a transaction pooler)."""
        await conn.execute(begin)
        try:
            result = await operation(conn)
        except Exception:
            if not conn.is_closed() and conn.is_in_transaction():
                with contextlib.suppress(Exception):  # the release rolls back (or drops) it then
                    await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
        return result

    async def _expire(self) -> None:
        with contextlib.suppress(TimeoutError, asyncpg.InterfaceError):
            await asyncio.wait_for(self.pool.expire_connections(), timeout=5)

    async def execute(self, sql: str, *args: Any, repeat_safe: bool = True) -> str:
        async def op(conn: Connection) -> str:
            return await conn.execute(sql, *args)

        return await self.run(op, repeat_safe=repeat_safe)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async def op(conn: Connection) -> list[asyncpg.Record]:
            return await conn.fetch(sql, *args)

        return await self.run(op)

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        async def op(conn: Connection) -> asyncpg.Record | None:
            return await conn.fetchrow(sql, *args)

        return await self.run(op)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async def op(conn: Connection) -> Any:
            return await conn.fetchval(sql, *args)

        return await self.run(op)

    async def fetchval_once(self, sql: str, *args: Any) -> Any:
        """:meth:`fetchval` for a statement that must not run twice (a consume without a key)."""

        async def op(conn: Connection) -> Any:
            return await conn.fetchval(sql, *args)

        return await self.run(op, repeat_safe=False)

    def pool_size(self) -> int:
        return self._pool.get_size() if self._pool is not None else 0

    def pool_max_size(self) -> int:
        return self._pool.get_max_size() if self._pool is not None else 0

    def pool_in_use(self) -> int:
        pool = self._pool
        return pool.get_size() - pool.get_idle_size() if pool is not None else 0

    def pool_waiting(self) -> int | None:
        """Callers waiting for a connection now; ``None`` when asyncpg cannot tell. asyncpg keeps
        its free connections in an ``asyncio`` queue and has no public count of the callers
        waiting on it: the queue's waiters are read when it has them."""
        waiters = getattr(getattr(self._pool, "_queue", None), "_getters", None)
        if waiters is None:
            return None
        return sum(1 for waiter in waiters if not waiter.done())

    def pool_usage(self) -> PoolUsage | None:
        """How full the pool is now (never waits); ``None`` before a lazy pool is opened."""
        if self._pool is None:
            return None
        return PoolUsage(self.pool_in_use(), self.pool_max_size(), self.pool_waiting())


__all__ = [
    "CONNECTION_ERRORS",
    "Connection",
    "Database",
    "StoreConnection",
    "PoolSettings",
    "create_pool",
    "is_connection_error",
    "keep_session",
    "one_transaction",
    "release",
    "transaction",
    "with_pooler",
]
