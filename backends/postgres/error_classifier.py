"""How the guard treats PostgreSQL's errors: its SQLSTATE table, and asyncpg's client errors.

:data:`POSTGRES_ERRORS` is the backend's :class:`~guarded.backend.ErrorClassifier`, registered
when :mod:`guarded.backends.postgres` is imported: any store whose driver raises asyncpg's
exceptions (this one, or one of your own) is classified by it. asyncpg errors carry their SQLSTATE
in a ``sqlstate`` attribute; a code is handled by its own entry, else by its class (its first two
characters), else it is :attr:`~guarded.backend.ErrorClass.FATAL`. The table is in
docs/durability.md ("What a failure means"). An error showing that the connection settings do not
suit a connection pooler in front of the server (:func:`~.pooler.pooler_error_kind`: asyncpg's
prepared statements behind a pooler in transaction mode, a refused start-up parameter) is held as
``pooler_mismatch`` whatever its SQLSTATE.
"""

from __future__ import annotations

from guarded.backend import (
    INSUFFICIENT_PRIVILEGE,
    INSUFFICIENT_RESOURCES,
    POOLER_MISMATCH,
    READ_ONLY,
    SCHEMA_MISMATCH,
    SERVER_UNAVAILABLE,
    SYSTEM_ERROR,
    TOO_MANY_CONNECTIONS,
    UNDEFINED_OBJECT,
    ErrorClass,
    register_classifier,
)

from .pooler import POOLER_SETTING, PoolerMismatchError, pooler_error_kind

Handling = tuple[ErrorClass, str | None]
"""How a SQLSTATE is handled, and the operational condition it is counted as (``None``: not counted)."""

_RETRY, _HOLD, _PARK = ErrorClass.RETRYABLE, ErrorClass.OPERATIONAL, ErrorClass.REJECTED

SQLSTATE_HANDLING: dict[str, Handling] = {
    # retry now
    "40001": (_RETRY, None),  # serialization_failure
    "40P01": (_RETRY, None),  # deadlock_detected
    "55P03": (_RETRY, None),  # lock_not_available (lock_timeout)
    "57014": (_RETRY, None),  # query_canceled (statement_timeout)
    "57P01": (_RETRY, SERVER_UNAVAILABLE),  # admin_shutdown
    "57P02": (_RETRY, SERVER_UNAVAILABLE),  # crash_shutdown
    "57P03": (_RETRY, SERVER_UNAVAILABLE),  # cannot_connect_now (starting up, in recovery)
    "53300": (_RETRY, TOO_MANY_CONNECTIONS),  # too_many_connections
    "53400": (_RETRY, INSUFFICIENT_RESOURCES),  # configuration_limit_exceeded
    # hold and replay
    "42P01": (_HOLD, UNDEFINED_OBJECT),  # undefined_table
    "42703": (_HOLD, UNDEFINED_OBJECT),  # undefined_column
    "42704": (_HOLD, UNDEFINED_OBJECT),  # undefined_object (a type, an index, a constraint)
    "42883": (_HOLD, UNDEFINED_OBJECT),  # undefined_function
    "3F000": (_HOLD, UNDEFINED_OBJECT),  # invalid_schema_name (no such schema)
    "3D000": (_HOLD, UNDEFINED_OBJECT),  # invalid_catalog_name (no such database)
    "57P04": (_HOLD, UNDEFINED_OBJECT),  # database_dropped
    "42501": (_HOLD, INSUFFICIENT_PRIVILEGE),  # insufficient_privilege (a missing grant)
    "25006": (_HOLD, READ_ONLY),  # read_only_sql_transaction (a standby, default_transaction_read_only)
    "26000": (_HOLD, POOLER_MISMATCH),  # invalid_sql_statement_name (asyncpg's cache behind a pooler)
    "42P05": (_HOLD, POOLER_MISMATCH),  # duplicate_prepared_statement (the same)
}
"""SQLSTATEs handled apart from the rest of their class."""

SQLSTATE_CLASS_HANDLING: dict[str, Handling] = {
    "08": (_RETRY, None),  # connection_exception
    "57": (_RETRY, SERVER_UNAVAILABLE),  # operator_intervention (the rest of it)
    "28": (_HOLD, INSUFFICIENT_PRIVILEGE),  # invalid_authorization_specification (wrong password)
    "42": (_HOLD, SCHEMA_MISMATCH),  # syntax_error_or_access_rule_violation (the rest of it)
    "53": (_HOLD, INSUFFICIENT_RESOURCES),  # insufficient_resources (disk full, out of memory)
    "58": (_HOLD, SYSTEM_ERROR),  # system_error (an I/O error)
    "22": (_PARK, None),  # data_exception
    "23": (_PARK, None),  # integrity_constraint_violation
    "54": (_PARK, None),  # program_limit_exceeded (an index row too large)
}
"""SQLSTATE classes (the code's first two characters); any other class is :attr:`ErrorClass.FATAL`.

Class 42 is about the statement and the schema, never the values bound to it (asyncpg sends
values as parameters): a statement that does not match the schema is fixed by a migration or a
deploy, so its writes are held. Classes 22, 23 and 54 are about the values: parked."""

NOT_SENT_SQLSTATES = frozenset({"08001", "08004", "57P03", "53300"})
"""Connection could not be established: the request never reached the server."""


def sqlstate_handling(code: str) -> Handling:
    """How the guard handles SQLSTATE ``code``, and the operational condition it counts it as."""
    found = SQLSTATE_HANDLING.get(code) or SQLSTATE_CLASS_HANDLING.get(code[:2])
    return found if found is not None else (ErrorClass.FATAL, None)


_CLIENT_ERRORS = frozenset({"InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"})
"""asyncpg's client-side errors about the connection (by class name: ``DataError``, an
``InterfaceError`` about a value, is not one of them)."""


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE ``exc`` carries (asyncpg's ``sqlstate`` attribute), or ``None``."""
    code = getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) else None


class PostgresErrors:
    """The PostgreSQL backend's :class:`~guarded.backend.ErrorClassifier`."""

    def error_class(self, exc: BaseException) -> ErrorClass | None:
        if pooler_error_kind(exc) is not None:
            return _HOLD
        code = sqlstate(exc)
        if code is not None:
            return sqlstate_handling(code)[0]
        return ErrorClass.RETRYABLE if type(exc).__name__ in _CLIENT_ERRORS else None

    def condition(self, exc: BaseException) -> str | None:
        if pooler_error_kind(exc) is not None:
            return POOLER_MISMATCH
        code = sqlstate(exc)
        return sqlstate_handling(code)[1] if code is not None else None

    def reached_backend(self, exc: BaseException) -> bool | None:
        code = sqlstate(exc)
        return False if code is not None and code in NOT_SENT_SQLSTATES else None

    def describe(self, exc: BaseException) -> str | None:
        if isinstance(exc, PoolerMismatchError):
            return f"pooler mismatch ({exc.kind}): set {POOLER_SETTING}"
        code = sqlstate(exc)
        return f"SQLSTATE {code}" if code is not None else None


POSTGRES_ERRORS = PostgresErrors()
register_classifier(POSTGRES_ERRORS)

__all__ = [
    "NOT_SENT_SQLSTATES",
    "POSTGRES_ERRORS",
    "SQLSTATE_CLASS_HANDLING",
    "SQLSTATE_HANDLING",
    "Handling",
    "PostgresErrors",
    "sqlstate",
    "sqlstate_handling",
]
