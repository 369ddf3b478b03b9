"""Exceptions raised by guarded and its backends."""

from __future__ import annotations


class GuardedError(Exception):
    """Base class of every exception guarded raises on purpose."""


class InvalidPayloadError(GuardedError, ValueError):
    """A value that can never be stored: not JSON, a lone surrogate, NaN, a missing id, too large.

    Never retryable. ``path`` locates the offending value inside the argument; ``method`` names
    the store method once known. ``str(error)`` is ``"<method>: <path>: <reason>"``.

    Neither ``path`` nor ``reason`` ever copies payload contents, so both are safe to log, to
    export and to keep as a parked write's reason: a path names record fields and arguments by
    their name (``event.payload``), list items by their index (``[3]``) and mapping entries by
    their position and their key's type, never by the key (``[key #0 (str)]``, the first entry;
    see :func:`guarded.codec.key_path`) — ``state[key #2 (str)][key #0 (str)][3]`` is the fourth
    item of the list under the first key of the mapping under the third key of ``state``. A
    reason says what kind of value was refused (its type, NaN, a lone surrogate and its index, an
    integer over the digit limit), never the value.
    """

    def __init__(self, reason: str, *, path: str = "", method: str | None = None) -> None:
        self.reason = reason
        self.path = path
        self.method = method
        super().__init__(reason)

    def at(self, prefix: str) -> InvalidPayloadError:
        """Prefix the path with the name of the enclosing field or argument, and return self."""
        if prefix:
            self.path = prefix + (
                self.path if self.path.startswith("[") or not self.path else "." + self.path
            )
        return self

    def for_method(self, method: str) -> InvalidPayloadError:
        """Record the store method the bad value was passed to, and return self."""
        self.method = method
        return self

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.method, self.path) if part)
        return f"{where}: {self.reason}" if where else self.reason


class CallerError(GuardedError, TypeError):
    """A call the caller got wrong: arguments that do not bind to the method's signature, or an
    argument of the wrong type (a string where a ``StoredEvent`` belongs).

    Raised by the guard before the call reaches anything else (see :mod:`guarded.layers.call_check`):
    the call ends with outcome ``rejected`` and an ERROR log record (in strict mode it raises to
    the caller). The message names the method, the argument and the type it got, never a value.
    """


class WriteRefusedError(GuardedError):
    """A write of a batch that the backend refused as bad data or with a programming error: it is
    parked with its reason (``guarded dlq list --parked``). The caller's call ends ``rejected``;
    in strict mode this is raised to it."""

    error_class = "rejected"
    counts_against_backend = False


class GuardClosedError(GuardedError, RuntimeError):
    """A write reached a guard that is closing or closed, past the point where it could still be
    kept: it is refused, never answered as kept. Writing through a closed guard is the caller's
    programming error: the call ends ``rejected`` with an ERROR record, and in strict mode this is
    raised to it. Close a guard only once its callers are done (a framework's shutdown hook runs
    after requests drain)."""

    error_class = "programming"
    counts_against_backend = False


class WriteNotKeptError(GuardedError, RuntimeError):
    """A write the guard could not keep: the backend did not take it and the dead-letter spill file
    could not commit it (at its byte cap, a full disk, an unusable file). Nothing already
    acknowledged is evicted to make room; this write is refused at once instead (outcome
    ``refused``, an ERROR record, raised in strict mode). ``reason`` says why, without payload."""

    counts_against_backend = False

    answer: object = None
    """What a call outside strict mode is answered instead of its method's fallback value, when
    not ``None``: a refused artifact put answers the reference of the copy this process keeps
    (PenguiFlow expects an ``ArtifactRef``), its outcome ``refused`` all the same."""

    def __init__(self, reason: str, *, method: str | None = None) -> None:
        self.reason = reason
        self.method = method
        super().__init__(f"{method}: {reason}" if method else reason)


class WriteSupersededError(WriteNotKeptError):
    """The backend left ``refused`` items of a replayed upsert alone because the stored rows hold a
    newer logical time (:mod:`guarded.backend`): another process wrote those keys since. Raised
    by a backend after it applied the rest of the call. A replay counts those writes as superseded;
    a direct write the backend refuses so (a backend comparing direct writes, against the rule)
    ends with outcome ``refused``, never ``ok``."""

    def __init__(self, refused: int = 1, *, method: str | None = None) -> None:
        self.refused = refused
        super().__init__(f"{refused} write(s) older than the stored row left alone", method=method)


class SteeringValidationError(ValueError):
    """A steering payload does not satisfy its event type's required fields (spec 000).

    ``errors`` lists every problem found; each message names the offending field of the spec's
    table, never a value of the payload (safe to log and to keep as a parked reason).
    """

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("invalid steering payload: " + "; ".join(errors))


class CapabilityError(TypeError):
    """A store lacks methods a feature needs (see :func:`guarded.protocol.require_capabilities`)."""
