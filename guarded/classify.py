"""Classify a failure by what will happen if we wait.

- **Retry now** (:attr:`ErrorClass.RETRYABLE`): connection loss, timeouts, serialization failures
  and deadlocks, lock and statement timeouts, server shutdown and start-up, too many connections.
  The retry layer repeats the call within its deadline; a write that still fails is held in the
  dead-letter buffer and replayed.
- **Hold and replay** (:attr:`ErrorClass.OPERATIONAL`): the data is fine but the database cannot
  take it now: a table, column or schema missing (a rename, a migration), a missing grant, a
  read-only transaction (a failover to a standby), a full disk, a statement the schema does not
  match. Not retried within the call, counted as a backend failure, held and replayed once the
  condition is fixed — never parked. A call the guard's bulkhead could not admit before its
  deadline (:class:`~guarded.bulkhead.BulkheadTimeoutError`, nothing sent) is handled so too,
  except that it never counts against the backend (:func:`counts_against_backend`).
- **Park** (:attr:`ErrorClass.REJECTED`): errors about the data itself, which no wait can fix —
  :class:`~guarded.errors.InvalidPayloadError`, SQLSTATE classes 22 data exception and 23
  integrity constraint violation, 54 program limit exceeded (a key too long for its index).
- **The caller's bug** (:attr:`ErrorClass.PROGRAMMING`): a call that does not bind to the
  method's signature or passes the wrong type (:class:`~guarded.errors.CallerError`, raised before
  the call reaches the backend), and a ``TypeError`` or ``AttributeError`` the backend raises.
  Outcome ``rejected`` with an ERROR log record, never retried, held, parked or counted against
  the backend; raised to the caller in strict mode (:mod:`guarded.strict_mode`).
- Anything else (:attr:`ErrorClass.FATAL`): unknown errors, not retried, held.

Operational and retry-now conditions that need an operator's attention are also named by
:func:`operational_condition`, a small fixed set counted in
``guarded_store_operational_errors_total{store, method, condition}``. The table of SQLSTATE
classes is in docs/durability.md ("What a failure means").

asyncpg errors are classified by their ``sqlstate`` attribute, so asyncpg is not imported here.
"""

from __future__ import annotations

import asyncio
import socket
from enum import Enum

from . import telemetry_names as names
from .errors import CallerError, GuardedError, InvalidPayloadError, SteeringValidationError


class ErrorClass(str, Enum):
    """How the guard treats a failure (see the module docs)."""

    RETRYABLE = "retryable"
    """Retry now: the retry layer repeats the call; a write that still fails is held and replayed."""
    OPERATIONAL = "operational"
    """Hold and replay: the database cannot take the call until an operator or a migration fixes
    it. Not retried now, counts as a backend failure, never parked."""
    REJECTED = "rejected"
    """Bad data: never retried, parked, never counted against the backend's health."""
    PROGRAMMING = "programming"
    """A programming error (wrong arguments, a wrong type, a ``TypeError`` or ``AttributeError``
    in the backend): outcome ``rejected``, logged at ERROR, never retried, held, parked or counted
    against the backend's health."""
    FATAL = "fatal"
    """Unknown error: not retried, counts as a backend failure."""


# --- operational conditions: the ``condition`` label of guarded_store_operational_errors_total ----

UNDEFINED_OBJECT = "undefined_object"
INSUFFICIENT_PRIVILEGE = "insufficient_privilege"
READ_ONLY = "read_only"
SERVER_UNAVAILABLE = "server_unavailable"
TOO_MANY_CONNECTIONS = "too_many_connections"
INSUFFICIENT_RESOURCES = "insufficient_resources"
SCHEMA_MISMATCH = "schema_mismatch"
SYSTEM_ERROR = "system_error"
OPERATIONAL_CONDITIONS = names.OPERATIONAL_CONDITIONS
"""Every value of the ``condition`` label, defined once in :mod:`guarded.telemetry_names`."""

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


class CircuitOpenError(GuardedError):
    """The circuit breaker refused the call without contacting the backend."""

    reached_backend = False


class DeadlineExceededError(GuardedError, TimeoutError):
    """The call's overall deadline passed (per-attempt timeouts are plain ``TimeoutError``)."""


class BackendNotReachedError(GuardedError, ConnectionError):
    """Raised by backends and fault injectors when a request provably was not sent."""

    reached_backend = False


def sqlstate(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) else None


def classify(exc: BaseException) -> ErrorClass:
    """Classify ``exc`` for the retry layer and the breaker.

    An exception may declare its class in an ``error_class`` attribute (an :class:`ErrorClass`),
    as the guard's own :class:`~guarded.bulkhead.BulkheadTimeoutError` does.
    """
    declared = getattr(exc, "error_class", None)
    if isinstance(declared, ErrorClass):
        return declared
    if isinstance(exc, InvalidPayloadError):
        return ErrorClass.REJECTED
    code = sqlstate(exc)
    if code is not None:
        return sqlstate_handling(code)[0]
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError | EOFError):
        return ErrorClass.RETRYABLE
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError):
        return ErrorClass.RETRYABLE
    if type(exc).__name__ in {"InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"}:
        return ErrorClass.RETRYABLE
    if isinstance(exc, TypeError | AttributeError):
        return ErrorClass.PROGRAMMING
    if isinstance(exc, ValueError | UnicodeError):
        return ErrorClass.REJECTED
    return ErrorClass.FATAL


def is_programming_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a programming error (:attr:`ErrorClass.PROGRAMMING`): the caller's
    wrong call, or a ``TypeError``/``AttributeError`` of the backend. Never served stale, held or
    parked: the call is rejected and logged at ERROR (raised in strict mode)."""
    return classify(exc) is ErrorClass.PROGRAMMING


def counts_against_backend(exc: BaseException) -> bool:
    """Whether the circuit breaker records ``exc`` as a failure of the backend.

    Not bad data nor a programming error (:attr:`ErrorClass.REJECTED`,
    :attr:`ErrorClass.PROGRAMMING`: the caller's fault, or a bug), and not an error the guard
    raised on its own without asking the backend, declared by ``counts_against_backend = False``
    on its class (:class:`~guarded.bulkhead.BulkheadTimeoutError`: the call waited in line until
    its deadline). The breaker gives the admission back without a result for those.
    """
    declared = getattr(exc, "counts_against_backend", None)
    if isinstance(declared, bool):
        return declared
    return classify(exc) not in _NOT_THE_BACKENDS


_NOT_THE_BACKENDS = frozenset({ErrorClass.REJECTED, ErrorClass.PROGRAMMING})


def operational_condition(exc: BaseException) -> str | None:
    """The operational condition ``exc`` reports (one of :data:`OPERATIONAL_CONDITIONS`), or
    ``None`` for anything else: a condition an operator should hear about, whether the call is
    retried now (a server shutting down, too many connections) or held and replayed (a missing
    table, a missing grant, a read-only database)."""
    code = sqlstate(exc)
    return sqlstate_handling(code)[1] if code is not None else None


def reached_backend(exc: BaseException) -> bool:
    """``False`` only when the request provably never reached the backend, else ``True``.

    A consume (``load_planner_state``) without an idempotency key may be repeated only then.
    """
    declared = getattr(exc, "reached_backend", None)
    if isinstance(declared, bool):
        return declared
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return False
    code = sqlstate(exc)
    return not (code is not None and code in NOT_SENT_SQLSTATES)


def safe_message(exc: BaseException) -> str:
    """A description of ``exc`` fit for logs, spans and parked reasons: never text that may quote
    a payload.

    Our own errors and OS/timeout errors carry controlled text: a rejected payload's reason and
    path never copy a value or a mapping key (see :class:`~guarded.errors.InvalidPayloadError`),
    a steering validation error names only the fields of the spec. A database error is described
    by its SQLSTATE (its message may quote a row). A programming error keeps its message: the
    guard's own :class:`~guarded.errors.CallerError` names the method, the argument and a type,
    and Python's ``TypeError``/``AttributeError`` name types and attributes, so the bug can be
    found. Anything else is described only by its type.
    """
    code = sqlstate(exc)
    if code is not None:
        return f"SQLSTATE {code}"
    if isinstance(exc, InvalidPayloadError | SteeringValidationError | CallerError):
        return str(exc)[:300]
    if isinstance(exc, TypeError | AttributeError):
        return str(exc)[:300]
    if isinstance(exc, GuardedError | OSError | TimeoutError | asyncio.TimeoutError):
        return str(exc)[:200]
    return ""


def error_type(exc: BaseException) -> str:
    """The ``error.type`` attribute value: the exception's qualified class name (bounded cardinality)."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
