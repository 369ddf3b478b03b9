"""Circuit breaker layer: refuses calls at once while the breaker is open."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..pipeline.breaker import CircuitBreaker
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.classify import CircuitOpenError, counts_against_backend
from ..pipeline.compiled import Hooks


class CircuitBreakerLayer:
    """Admits calls through a :class:`~guarded.pipeline.breaker.CircuitBreaker` and records their results.

    The breaker judges the backend only. A call's duration leaves out the time it waited for
    admission by the bulkhead (:attr:`Call.queued <guarded.pipeline.call.Call.queued>`). A failure is
    recorded only when ``counts(error)`` says it is the backend's
    (:func:`~guarded.pipeline.classify.counts_against_backend`: not bad data, which is the caller's fault,
    not an admission timeout of the bulkhead, which never asked the backend); otherwise the
    admission is given back without a result.
    """

    def __init__(
        self, breaker: CircuitBreaker, *, counts: Callable[[BaseException], bool] = counts_against_backend
    ) -> None:
        self.breaker = breaker
        self._counts = counts

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        breaker = self.breaker
        counts = self._counts

        async def guarded_by_breaker(call: Call) -> Any:
            ticket = call.ticket  # admitted on the compiled success path, whose attempt failed
            if ticket is None:
                ticket = breaker.allow()
                if ticket is None:
                    raise CircuitOpenError(f"circuit open for store {method.store_name!r}")
            else:
                call.ticket = None
            try:
                result = await inner(call)
            except Exception as exc:
                if counts(exc):
                    duration = call.loop.time() - call.started - call.queued
                    breaker.record(ticket, failed=True, duration=duration)
                else:
                    breaker.release(ticket)
                raise
            except BaseException:
                breaker.release(ticket)
                raise
            breaker.record_success(ticket, call.loop.time() - call.started - call.queued)
            return result

        return guarded_by_breaker

    def hooks(self, method: MethodSetup) -> Hooks:
        """Admission before the call, its success recorded after (a refusal takes the chain)."""
        allow, record_success, release = self.breaker.allow, self.breaker.record_success, self.breaker.release

        def admit(call: Call) -> bool:
            ticket = allow()
            call.ticket = ticket
            return ticket is not None

        def give_back(call: Call) -> None:
            ticket = call.ticket
            call.ticket = None
            if ticket is not None:
                release(ticket)

        def succeeded(call: Call, result: Any) -> Any:
            ticket = call.ticket
            call.ticket = None
            assert ticket is not None
            record_success(ticket, call.loop.time() - call.started - call.queued)
            return result

        return Hooks(before=admit, undo=give_back, after=succeeded)
