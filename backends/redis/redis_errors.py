"""How the guard treats the Redis store's errors: redis-py's exceptions and the server's error
codes, mapped onto :class:`~guarded.backend.ErrorClass`.

=============================================  ===============  =========================
error                                          class            condition
=============================================  ===============  =========================
connection lost or refused, client timeout      retry now        (refused: never sent)
``LOADING`` (a restarted server reading AOF)    retry now        ``server_unavailable``
``BUSY`` (a script running too long)            retry now        ``server_unavailable``
``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``   retry now        ``server_unavailable``
``MOVED`` / ``ASK`` (the cluster client         retry now        --
follows them; seen here only past its retries)
``READONLY`` (a demoted master in a failover)   retry now        ``read_only``
``NOSCRIPT`` (script cache flushed)             retry now        --
max clients / connection pool exhausted         retry now        ``too_many_connections``
``OOM`` (``maxmemory`` reached, noeviction)     hold and replay  ``insufficient_resources``
``NOAUTH`` / ``WRONGPASS`` / ``NOPERM``         hold and replay  ``insufficient_privilege``
replicas not acknowledged (``WAIT``)            hold and replay  ``server_unavailable``
a value over the server's limits                park             --
``CROSSSLOT`` and other errors                  unknown          --
=============================================  ===============  =========================

``OOM`` is held, not a class of its own: :class:`~guarded.backend.ErrorClass` has none, and what
the guard must do is what it does for a full disk: stop retrying now (each retry would fail the
same way and add load), count it against the backend (the breaker opens), keep the writes in the
dead-letter buffer and replay them once memory is freed; the ``insufficient_resources`` condition
tells the operator why. Server messages are never logged (a script error may quote a value): the
description is the error's code (``redis OOM``).
"""

from __future__ import annotations

from redis import exceptions as redis_exceptions

from guarded.backend import (
    INSUFFICIENT_PRIVILEGE,
    INSUFFICIENT_RESOURCES,
    READ_ONLY,
    SERVER_UNAVAILABLE,
    TOO_MANY_CONNECTIONS,
    ErrorClass,
    register_classifier,
)

Handling = tuple[ErrorClass, str | None]

_RETRY, _HOLD, _PARK = ErrorClass.RETRYABLE, ErrorClass.OPERATIONAL, ErrorClass.REJECTED


class ReplicasNotAcknowledgedError(RuntimeError):
    """A write reached the primary but fewer replicas than ``replicas_to_ack`` confirmed it in time.

    Held and replayed (last-write-wins and idempotency keys make the replay safe), so a write is
    acknowledged only once it is on that many replicas or in the guard's spill file."""

    error_class = ErrorClass.OPERATIONAL

    def __init__(self, wanted: int, acknowledged: int) -> None:
        super().__init__(f"{acknowledged} of {wanted} replicas acknowledged the write")
        self.wanted = wanted
        self.acknowledged = acknowledged


CODE_HANDLING: dict[str, Handling] = {
    "LOADING": (_RETRY, SERVER_UNAVAILABLE),
    "BUSY": (_RETRY, SERVER_UNAVAILABLE),
    "MASTERDOWN": (_RETRY, SERVER_UNAVAILABLE),
    "CLUSTERDOWN": (_RETRY, SERVER_UNAVAILABLE),
    "TRYAGAIN": (_RETRY, SERVER_UNAVAILABLE),
    "MOVED": (_RETRY, None),
    "ASK": (_RETRY, None),
    "READONLY": (_RETRY, READ_ONLY),
    "NOSCRIPT": (_RETRY, None),
    "OOM": (_HOLD, INSUFFICIENT_RESOURCES),
    "NOAUTH": (_HOLD, INSUFFICIENT_PRIVILEGE),
    "WRONGPASS": (_HOLD, INSUFFICIENT_PRIVILEGE),
    "NOPERM": (_HOLD, INSUFFICIENT_PRIVILEGE),
}
"""The server's error codes (the first word of its reply) handled apart from the rest."""

_TOO_LARGE = ("string exceeds maximum allowed size", "invalid bulk length", "too large")
"""Phrases of the replies that refuse a value for its size: the same write can never succeed."""


_CODE_OF_EXCEPTION: tuple[tuple[type[BaseException], str], ...] = (
    (redis_exceptions.BusyLoadingError, "LOADING"),  # before ConnectionError: redis-py derives it from that
    (redis_exceptions.ReadOnlyError, "READONLY"),
    (redis_exceptions.OutOfMemoryError, "OOM"),
    (redis_exceptions.NoScriptError, "NOSCRIPT"),
    (redis_exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis_exceptions.TryAgainError, "TRYAGAIN"),
    (redis_exceptions.MasterDownError, "MASTERDOWN"),
    (redis_exceptions.AskError, "ASK"),
    (redis_exceptions.MovedError, "MOVED"),
    (redis_exceptions.NoPermissionError, "NOPERM"),
)
"""redis-py's exception classes for the server's error codes, most specific first."""


def error_code(exc: BaseException) -> str | None:
    """The server's error code ``exc`` carries (``OOM``, ``BUSY``, ...), or ``None``."""
    for kind, code in _CODE_OF_EXCEPTION:
        if isinstance(exc, kind):
            return code
    if isinstance(exc, redis_exceptions.ResponseError):
        words = str(exc).split(None, 1)
        if words and words[0].isupper() and words[0].isalpha():
            return words[0]
        return "ERR"
    return None


def handling(exc: BaseException) -> Handling | None:
    """How the guard handles ``exc`` and the condition it is counted as, when it is Redis's."""
    if isinstance(exc, ReplicasNotAcknowledgedError):
        return _HOLD, SERVER_UNAVAILABLE
    if isinstance(exc, redis_exceptions.BusyLoadingError):  # a ConnectionError in redis-py
        return CODE_HANDLING["LOADING"]
    if isinstance(exc, redis_exceptions.AuthenticationError | redis_exceptions.AuthorizationError):
        return _HOLD, INSUFFICIENT_PRIVILEGE
    if isinstance(exc, redis_exceptions.MaxConnectionsError | redis_exceptions.MaxClientsReachedError):
        return _RETRY, TOO_MANY_CONNECTIONS
    if isinstance(exc, redis_exceptions.ConnectionError | redis_exceptions.TimeoutError):
        return _RETRY, None
    if isinstance(exc, redis_exceptions.RedisClusterException) and not isinstance(
        exc, redis_exceptions.ClusterCrossSlotError
    ):
        return _RETRY, SERVER_UNAVAILABLE
    if isinstance(exc, redis_exceptions.DataError):
        return _PARK, None
    code = error_code(exc)
    if code is None:
        return None
    found = CODE_HANDLING.get(code)
    if found is not None:
        return found
    if code == "ERR" and any(phrase in str(exc) for phrase in _TOO_LARGE):
        return _PARK, None
    return ErrorClass.FATAL, None


def _refused(exc: BaseException) -> bool:
    """Whether a connection error is a refused (never established) connection."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "Connection refused" in str(exc) or "Error 111 " in str(exc)


class RedisErrors:
    """The Redis backend's :class:`~guarded.backend.ErrorClassifier` (see the module docs)."""

    def error_class(self, exc: BaseException) -> ErrorClass | None:
        found = handling(exc)
        return None if found is None else found[0]

    def condition(self, exc: BaseException) -> str | None:
        found = handling(exc)
        return None if found is None else found[1]

    def reached_backend(self, exc: BaseException) -> bool | None:
        if isinstance(exc, redis_exceptions.ConnectionError) and _refused(exc):
            return False
        return None

    def describe(self, exc: BaseException) -> str | None:
        if isinstance(exc, ReplicasNotAcknowledgedError):
            return str(exc)
        if isinstance(exc, redis_exceptions.ConnectionError | redis_exceptions.TimeoutError):
            return f"redis {type(exc).__name__}"
        code = error_code(exc)
        if code is not None:
            return f"redis {code}"
        if isinstance(exc, redis_exceptions.RedisError):
            return f"redis {type(exc).__name__}"
        return None


REDIS_ERRORS = RedisErrors()
register_classifier(REDIS_ERRORS)

__all__ = [
    "CODE_HANDLING",
    "REDIS_ERRORS",
    "RedisErrors",
    "ReplicasNotAcknowledgedError",
    "error_code",
    "handling",
]
