"""One logical call through the guard, and the shape every layer has (tower's Layer/Service)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..outcome import Outcome

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..config import ResolvedMethodConfig
    from ..policy import MethodPolicy


_OK = Outcome.OK  # enum attribute lookups are slow on CPython 3.11 (about 0.1 µs)


class Call:
    """A method call as it travels through the layers; layers annotate it as they go.

    Three attributes belong to one layer each and are set by its ``enter`` before its ``ok`` or
    ``failed`` reads them (unset until then, so a call pays nothing for a layer it never meets):
    ``ticket``, the breaker's admission of the call; ``held``, the dead-letter layer's hold on a
    write's key (its call stamp, key slot, logical-time token and key); ``slot``, the key slot and
    call stamp a consume registered with (the stale-read layer's).
    """

    __slots__ = (
        "args",
        "attempts",
        "deadline",
        "error",
        "held",
        "kwargs",
        "loop",
        "method",
        "outcome",
        "queued",
        "retries",
        "slot",
        "span",
        "started",
        "ticket",
    )
    ticket: int | None
    held: Any
    slot: Any

    def __init__(
        self,
        method: MethodSetup,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.loop = loop
        self.started = started
        """Event-loop time when the call began."""
        self.deadline = started + method.settings.deadline
        """Event-loop time by which the call must return."""
        self.attempts = 0
        """Attempts made so far: the retry layer's count."""
        self.queued = 0.0
        """Seconds the call waited for admission to the backend, every attempt together; written
        only by the bulkhead layer. The guard's own queueing: the breaker leaves it out."""
        self.outcome = _OK
        self.error: BaseException | None = None
        """The failure behind the outcome (written by :meth:`settle`); dropped by :meth:`answered`
        once the call has its answer, so read it while the call runs through your layer."""
        self.retries: list[tuple[int, str, float]] | None = None
        """(attempt that failed, error type, backoff in seconds) for each retry."""
        self.span: Span | None = None

    def settle(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """The call's outcome and, when there is one, the failure behind it: the one writer of
        both. The layer that answers a call settles it; the metrics layer reads what it settled."""
        self.outcome = outcome
        if error is not None:
            self.error = error

    def answered(self) -> None:
        """The call has its answer: forget its failure. It references the traceback whose frames
        reference this call; kept, it made a reference cycle per failed call that only the cyclic
        garbage collector frees."""
        self.error = None

    def note_retry(self, error_type: str, delay: float) -> None:
        if self.retries is None:
            self.retries = []
        self.retries.append((self.attempts, error_type, delay))


@dataclass(frozen=True, slots=True)
class MethodSetup:
    """Everything layers need to know about one method of one guarded store."""

    store_name: str
    label: str
    """The ``method`` label of metrics and ``db.operation.name`` of spans (``artifact_store.get`` ...)."""
    policy: MethodPolicy
    settings: ResolvedMethodConfig
    honours_idempotency_key: bool = False


Service = Callable[[Call], Awaitable[Any]]
"""Runs a call and returns its result. It need not be a coroutine function: a layer with nothing
to do for a particular call may return ``inner(call)`` itself and so add no frame."""


class Layer(Protocol):
    """One concern of the guard. ``wrap`` is called once per method when the guard is built and
    returns the service that runs that method's calls; a layer with nothing to do for a method
    returns ``inner`` unchanged, so it costs nothing there."""

    def wrap(self, inner: Service, method: MethodSetup) -> Service: ...
