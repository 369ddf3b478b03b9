"""Which failures are worth another attempt, and which provably never reached the backend.

Retryable: connection loss, timeouts, PostgreSQL serialization failures and deadlocks, server
shutdown, too many connections. Never retried: programming errors (``TypeError``,
``AttributeError`` ...), data errors (:class:`~guarded.errors.InvalidPayloadError`, SQLSTATE
classes 22 data exception, 23 integrity violation, 42 syntax or access rule, 54 program limit
exceeded — a key too long for its index, say), anything unknown.
asyncpg errors are classified by their ``sqlstate`` attribute, so asyncpg is not imported here.
"""

from __future__ import annotations

import asyncio
import socket
from enum import Enum

from .errors import GuardedError, InvalidPayloadError

RETRYABLE_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "57014",  # query_canceled (statement_timeout)
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now
        "53300",  # too_many_connections
        "53400",  # configuration_limit_exceeded
    }
)
RETRYABLE_SQLSTATE_CLASSES = frozenset({"08"})  # connection_exception
REJECTED_SQLSTATE_CLASSES = frozenset({"22", "23", "42", "54"})
"""Bad data: data exception, integrity violation, syntax or access rule, program limit exceeded
(an index row or a statement too large for the server: the same write can never succeed)."""
NOT_SENT_SQLSTATES = frozenset({"08001", "08004", "57P03", "53300"})
"""Connection could not be established: the request never reached the server."""


class ErrorClass(str, Enum):
    """How the guard treats a failure."""

    RETRYABLE = "retryable"
    REJECTED = "rejected"
    """Bad data: never retried, never counted against the backend's health."""
    FATAL = "fatal"
    """Programming or unknown error: not retried, counts as a backend failure."""


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
    """Classify ``exc`` for the retry layer and the breaker."""
    if isinstance(exc, InvalidPayloadError):
        return ErrorClass.REJECTED
    code = sqlstate(exc)
    if code is not None:
        if code in RETRYABLE_SQLSTATES or code[:2] in RETRYABLE_SQLSTATE_CLASSES:
            return ErrorClass.RETRYABLE
        if code[:2] in REJECTED_SQLSTATE_CLASSES:
            return ErrorClass.REJECTED
        return ErrorClass.FATAL
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError | EOFError):
        return ErrorClass.RETRYABLE
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError):
        return ErrorClass.RETRYABLE
    if type(exc).__name__ in {"InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"}:
        return ErrorClass.RETRYABLE
    if isinstance(exc, ValueError | TypeError | KeyError | UnicodeError):
        return ErrorClass.REJECTED if isinstance(exc, ValueError | UnicodeError) else ErrorClass.FATAL
    return ErrorClass.FATAL


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
    """A description of ``exc`` fit for logs and spans: never free text that may quote a payload.

    Our own errors and OS/timeout errors carry controlled text (for a rejected payload, the reason
    without the path, whose keys come from the payload); a database error is described by its
    SQLSTATE; anything else only by its type.
    """
    code = sqlstate(exc)
    if code is not None:
        return f"SQLSTATE {code}"
    if isinstance(exc, InvalidPayloadError):
        # Its path names the keys of the payload (``state['<key>']``): keep only the reason.
        return exc.reason[:200]
    if isinstance(exc, GuardedError | OSError | TimeoutError | asyncio.TimeoutError):
        return str(exc)[:200]
    return ""


def error_type(exc: BaseException) -> str:
    """The ``error.type`` attribute value: the exception's qualified class name (bounded cardinality)."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
