"""Running behind a connection pooler in transaction mode (PgBouncer, RDS Proxy, Supavisor).

A pooler in transaction mode lends the client a server connection for one transaction at a time:
the next transaction may run on another server connection, so nothing may live in a *session*.
``PoolSettings(pooler="transaction")`` (``pooler="transaction"`` on ``connect``/``lazy``,
``GUARDED_PG_POOLER=transaction``) makes the store keep none:

* start-up parameters: only ``application_name`` (PgBouncer refuses any parameter it does not
  track unless it is listed in its ``ignore_startup_parameters``);
* timeouts: ``statement_timeout`` is set with ``SET LOCAL`` in each operation's transaction
  (:func:`begin_statement`): ``BEGIN`` and the ``SET LOCAL`` go in one round trip, ``COMMIT`` in
  another. When the server connections start their sessions with a ``statement_timeout`` of their
  own (the role's or the database's, ``ALTER ROLE app SET statement_timeout = '30s'``) no longer
  than the store's, the server already enforces it and operations run without a transaction of
  their own (:func:`server_timeout_suffices`, checked once on the first operation); so do they with
  ``statement_timeout=None``;
* no named prepared statements (asyncpg's ``statement_cache_size=0``): each statement is parsed
  unnamed and executed in the same message flow, which a transaction pooler never splits; its
  description is kept per connection, so that flow is one round trip
  (:mod:`.statement_descriptions`);
* migrations under transaction-scoped advisory locks, nothing set on the session;
* no reset on release (asyncpg still rolls back an open transaction): a session command would run
  on whichever server connection the pooler picked, another client's perhaps.

A store left in the default (session) mode behind a transaction pooler fails in ways that name
neither the pooler nor the setting: :func:`pooler_error_kind` recognises them and
:class:`PoolerMismatchError` says what to change.
"""

from __future__ import annotations

from guarded.backend import metric_names as names
from guarded.errors import GuardedError

SESSION = "session"
TRANSACTION = "transaction"
POOLER_MODES = (SESSION, TRANSACTION)
"""Values of ``pooler``: ``"session"`` (or ``None``, the default: a direct connection or a pooler in
session mode) and ``"transaction"``."""

POOLER_SETTING = 'pooler="transaction" (PoolSettings(pooler="transaction"), GUARDED_PG_POOLER=transaction)'
"""How to name the setting in messages."""

POOLER_ERROR_KINDS = names.PG_POOLER_ERROR_KINDS
"""Every value of the ``kind`` label of ``guarded_pg_pooler_errors_total``."""
PREPARED_STATEMENT_MISSING, PREPARED_STATEMENT_EXISTS, STARTUP_PARAMETER_REFUSED = POOLER_ERROR_KINDS

_WHAT = {
    PREPARED_STATEMENT_MISSING: "a prepared statement of this connection is missing on the server",
    PREPARED_STATEMENT_EXISTS: "a prepared statement name of this connection is already taken on the server",
    STARTUP_PARAMETER_REFUSED: "the server refused a connection start-up parameter",
}


class PoolerMismatchError(GuardedError, RuntimeError):
    """The store's connection settings do not suit the connection pooler in front of the server.

    ``kind`` is one of :data:`POOLER_ERROR_KINDS`; the message names the setting to change.
    The guard treats it as operational (writes held and replayed once the setting is fixed).
    """

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        super().__init__(
            f"{_WHAT[kind]} ({detail}): a connection pooler in transaction mode (PgBouncer "
            "pool_mode=transaction, RDS Proxy, Supavisor's transaction port) sits in front of "
            f"PostgreSQL; connect with {POOLER_SETTING}, or connect directly or through a pooler "
            "in session mode"
        )


def check_pooler(value: object, setting: str = "pooler") -> str:
    """``value`` as a pooler mode (``None`` is ``"session"``); a ``ValueError`` naming ``setting``
    otherwise."""
    if value is None:
        return SESSION
    if isinstance(value, str) and value.strip().lower() in POOLER_MODES:
        return value.strip().lower()
    raise ValueError(f"{setting} must be one of {', '.join(POOLER_MODES)} (or None), got {value!r}")


def begin_statement(statement_timeout: float | None) -> str | None:
    """What starts an operation's transaction behind a transaction pooler: ``BEGIN`` with the
    ``SET LOCAL statement_timeout`` (one simple query, one round trip), or ``None`` when there is no
    timeout to set and so no need for a transaction of the operation's own."""
    if statement_timeout is None:
        return None
    return f"BEGIN; SET LOCAL statement_timeout = {int(statement_timeout * 1000)}"


SERVER_DEFAULT_TIMEOUT = "SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout'"
"""The ``statement_timeout`` a server connection starts each session with (milliseconds, as text):
the role's, the database's or the server's setting, whatever a client ``SET`` on the session."""


def server_timeout_suffices(default_ms: object, statement_timeout: float | None) -> bool:
    """Whether a server whose sessions start with ``statement_timeout = default_ms`` cancels every
    statement within ``statement_timeout`` seconds already (``0``, no limit, never does)."""
    if statement_timeout is None:
        return True
    try:
        default = int(str(default_ms))
    except ValueError:
        return False
    return 0 < default <= int(statement_timeout * 1000)


def pooler_error_kind(exc: BaseException) -> str | None:
    """Which :data:`POOLER_ERROR_KINDS` ``exc`` is, or ``None`` when it is no pooler mismatch.

    The store never prepares statements by name itself, so a missing or duplicate prepared
    statement (``26000``, ``42P05``) is asyncpg's cache meeting another server connection; an
    ``08P01`` "unsupported startup parameter" is PgBouncer refusing ``statement_timeout``."""
    if isinstance(exc, PoolerMismatchError):
        return exc.kind
    code = getattr(exc, "sqlstate", None)
    if code == "26000":
        return PREPARED_STATEMENT_MISSING
    if code == "42P05":
        return PREPARED_STATEMENT_EXISTS
    if code == "08P01" and "unsupported startup parameter" in str(exc):
        return STARTUP_PARAMETER_REFUSED
    return None


def explain_pooler_error(exc: BaseException) -> PoolerMismatchError | None:
    """A :class:`PoolerMismatchError` for ``exc`` when it is one (to raise from it), else ``None``."""
    if isinstance(exc, PoolerMismatchError):
        return exc
    kind = pooler_error_kind(exc)
    if kind is None:
        return None
    return PoolerMismatchError(kind, f"SQLSTATE {getattr(exc, 'sqlstate', '?')}: {str(exc).splitlines()[0]}")


__all__ = [
    "POOLER_ERROR_KINDS",
    "POOLER_MODES",
    "POOLER_SETTING",
    "PREPARED_STATEMENT_EXISTS",
    "PREPARED_STATEMENT_MISSING",
    "SERVER_DEFAULT_TIMEOUT",
    "SESSION",
    "STARTUP_PARAMETER_REFUSED",
    "TRANSACTION",
    "PoolerMismatchError",
    "begin_statement",
    "check_pooler",
    "explain_pooler_error",
    "pooler_error_kind",
    "server_timeout_suffices",
]
