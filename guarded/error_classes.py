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
  deadline (:class:`~guarded.layers.bulkhead.BulkheadTimeoutError`, nothing sent) is handled so too,
  except that it never counts against the backend (:func:`counts_against_backend`).
- **Park** (:attr:`ErrorClass.REJECTED`): errors about the data itself, which no wait can fix —
  :class:`~guarded.errors.InvalidPayloadError`, a ``ValueError``, and what a backend's classifier
  says is about the values (PostgreSQL: SQLSTATE classes 22, 23 and 54).
- **The caller's bug** (:attr:`ErrorClass.PROGRAMMING`): a call that does not bind to the
  method's signature or passes the wrong type (:class:`~guarded.errors.CallerError`, raised before
  the call reaches the backend), and a ``TypeError`` or ``AttributeError`` the backend raises.
  Outcome ``rejected`` with an ERROR log record, never retried, held or counted against the
  backend; a write the backend failed so is parked with its reason, to be replayed once the bug is
  fixed; raised to the caller in strict mode (:mod:`guarded.pipeline.strict_mode`).
- Anything else (:attr:`ErrorClass.FATAL`): unknown errors, not retried, held.

Operational and retry-now conditions that need an operator's attention are also named by
:func:`operational_condition`, a small fixed set counted in
``guarded_store_operational_errors_total{store, method, condition}``.

The core knows no database: a backend supplies an :class:`ErrorClassifier` for its driver's
errors and registers it (:func:`register_classifier`); the PostgreSQL backend's reads SQLSTATEs
(:mod:`guarded.backends.postgres.error_classifier`, its table in docs/durability.md "What a failure means").
"""

from __future__ import annotations

import asyncio
import re
import socket
from enum import Enum
from typing import Protocol

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
    in the backend): outcome ``rejected``, logged at ERROR, never retried, held or counted against
    the backend's health; a write the backend failed so is parked."""
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
POOLER_MISMATCH = "pooler_mismatch"
OPERATIONAL_CONDITIONS: tuple[str, ...] = (
    UNDEFINED_OBJECT,
    INSUFFICIENT_PRIVILEGE,
    READ_ONLY,
    SERVER_UNAVAILABLE,
    TOO_MANY_CONNECTIONS,
    INSUFFICIENT_RESOURCES,
    SCHEMA_MISMATCH,
    SYSTEM_ERROR,
    POOLER_MISMATCH,
)
"""Every value of the ``condition`` label (the metric catalog,
:mod:`guarded.observability.telemetry_names`, lists these)."""


_BY_VALUE = {kind.value: kind for kind in ErrorClass}


class ErrorClassifier(Protocol):
    """What a backend knows of its own errors (its driver's exceptions, its server's codes).

    Each method answers for an exception it recognises and returns ``None`` for any other, which
    the core then judges by its generic rules. The PostgreSQL backend's
    (:data:`guarded.backends.postgres.error_classifier.POSTGRES_ERRORS`) reads SQLSTATEs.
    """

    def error_class(self, exc: BaseException) -> ErrorClass | None:
        """How the guard treats ``exc``."""
        ...

    def condition(self, exc: BaseException) -> str | None:
        """The operational condition ``exc`` reports (one of :data:`OPERATIONAL_CONDITIONS`)."""
        ...

    def reached_backend(self, exc: BaseException) -> bool | None:
        """``False`` when the request provably never reached the backend."""
        ...

    def describe(self, exc: BaseException) -> str | None:
        """A description of ``exc`` fit for logs (never text that may quote a payload)."""
        ...


_classifiers: tuple[ErrorClassifier, ...] = ()


def register_classifier(classifier: ErrorClassifier) -> None:
    """Have :func:`classify` and its siblings consult ``classifier`` (once, however often it is
    registered). A backend registers its own when it is imported; a store declaring one in an
    ``error_classifier`` attribute has it registered by :func:`guarded.guard`."""
    global _classifiers
    if classifier not in _classifiers:
        _classifiers = (*_classifiers, classifier)


class CircuitOpenError(GuardedError):
    """The circuit breaker refused the call without contacting the backend."""

    reached_backend = False
    error_class = ErrorClass.FATAL
    """Not retried now (the breaker decides when the backend is asked again); declared, so a
    refused call, the cheapest failure there is, is classified at once."""


class DeadlineExceededError(GuardedError, TimeoutError):
    """The call's overall deadline passed (per-attempt timeouts are plain ``TimeoutError``)."""


class BackendNotReachedError(GuardedError, ConnectionError):
    """Raised by backends and fault injectors when a request provably was not sent."""

    reached_backend = False


def classify(exc: BaseException) -> ErrorClass:
    """Classify ``exc`` for the retry layer and the breaker.

    An exception may declare its class in an ``error_class`` attribute (an :class:`ErrorClass` or
    its value), as the guard's own :class:`~guarded.layers.bulkhead.BulkheadTimeoutError` does.
    """
    declared = getattr(exc, "error_class", None)
    if isinstance(declared, ErrorClass):
        return declared
    if isinstance(declared, str) and declared in _BY_VALUE:
        return _BY_VALUE[declared]
    if isinstance(exc, InvalidPayloadError):
        return ErrorClass.REJECTED
    for classifier in _classifiers:
        found = classifier.error_class(exc)
        if found is not None:
            return found
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError | EOFError):
        return ErrorClass.RETRYABLE
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError):
        return ErrorClass.RETRYABLE
    if isinstance(exc, TypeError | AttributeError):
        return ErrorClass.PROGRAMMING
    if isinstance(exc, ValueError | UnicodeError):
        return ErrorClass.REJECTED
    return ErrorClass.FATAL


def is_programming_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a programming error (:attr:`ErrorClass.PROGRAMMING`): the caller's
    wrong call, or a ``TypeError``/``AttributeError`` of the backend. Never served stale or held:
    the call is rejected and logged at ERROR (raised in strict mode)."""
    return classify(exc) is ErrorClass.PROGRAMMING


NO_WAIT_FIXES = frozenset({ErrorClass.REJECTED, ErrorClass.PROGRAMMING})
"""Bad data and bugs: no wait fixes them. The call ends ``rejected``; a write is parked with its
reason, never held for replay; neither counts against the backend."""


def no_wait_fixes(exc: BaseException) -> bool:
    """Whether ``exc`` is bad data or a bug (:data:`NO_WAIT_FIXES`)."""
    return classify(exc) in NO_WAIT_FIXES


def counts_against_backend(exc: BaseException) -> bool:
    """Whether the circuit breaker records ``exc`` as a failure of the backend.

    Not bad data nor a programming error (:attr:`ErrorClass.REJECTED`,
    :attr:`ErrorClass.PROGRAMMING`: the caller's fault, or a bug), and not an error the guard
    raised on its own without asking the backend, declared by ``counts_against_backend = False``
    on its class (:class:`~guarded.layers.bulkhead.BulkheadTimeoutError`: the call waited in line until
    its deadline). The breaker gives the admission back without a result for those.
    """
    declared = getattr(exc, "counts_against_backend", None)
    if isinstance(declared, bool):
        return declared
    return not no_wait_fixes(exc)


def operational_condition(exc: BaseException) -> str | None:
    """The operational condition ``exc`` reports (one of :data:`OPERATIONAL_CONDITIONS`), or
    ``None`` for anything else: a condition an operator should hear about, whether the call is
    retried now (a server shutting down, too many connections) or held and replayed (a missing
    table, a missing grant, a read-only database)."""
    for classifier in _classifiers:
        found = classifier.condition(exc)
        if found is not None:
            return found
    return None


def reached_backend(exc: BaseException) -> bool:
    """``False`` only when the request provably never reached the backend, else ``True``.

    A consume (``load_planner_state``) without an idempotency key may be repeated only then.
    """
    declared = getattr(exc, "reached_backend", None)
    if isinstance(declared, bool):
        return declared
    for classifier in _classifiers:
        found = classifier.reached_backend(exc)
        if found is not None:
            return found
    return not isinstance(exc, ConnectionRefusedError | socket.gaierror)


def safe_message(exc: BaseException) -> str:
    """A description of ``exc`` fit for logs, spans and parked reasons: never text that may quote
    a payload.

    Our own errors and OS/timeout errors carry controlled text: a rejected payload's reason and
    path never copy a value or a mapping key (see :class:`~guarded.errors.InvalidPayloadError`),
    a steering validation error names only the fields of the spec. A backend's classifier
    describes its own errors (PostgreSQL's by SQLSTATE: the message may quote a row). A
    programming error keeps its message: the guard's own :class:`~guarded.errors.CallerError`
    names the method, the argument and a type, and Python's ``TypeError``/``AttributeError`` name
    types and attributes, so the bug can be found. Anything else is described only by its type.
    """
    for classifier in _classifiers:
        found = classifier.describe(exc)
        if found is not None:
            return found
    if isinstance(exc, InvalidPayloadError | SteeringValidationError | CallerError):
        return str(exc)[:300]
    if isinstance(exc, TypeError | AttributeError):
        return redact_quoted(str(exc))[:300]
    if isinstance(exc, GuardedError | OSError | TimeoutError | asyncio.TimeoutError):
        return str(exc)[:200]
    return ""


_QUOTED = re.compile(r"'([^']*)'")


def redact_quoted(text: str) -> str:
    """``text`` with every quoted name that is not a Python identifier replaced by ``'…'``.

    Python's ``TypeError``/``AttributeError`` messages quote names: of parameters, attributes and
    types, which are code, and useful to find the bug. A name that is no identifier came from data
    (a payload's key splatted as ``**state`` into a call, ``'ssn_123-45-6789'``): redacted.
    """

    def keep(match: re.Match[str]) -> str:
        name = match.group(1)
        return match.group(0) if name.isidentifier() and len(name) <= 64 else "'…'"

    return _QUOTED.sub(keep, text)


def error_type(exc: BaseException) -> str:
    """The ``error.type`` attribute value: the exception's qualified class name (bounded cardinality)."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
