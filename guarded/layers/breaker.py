"""Circuit breaker layer: refuses calls at once while the breaker is open."""

from __future__ import annotations

from typing import Any

from ..breaker import CircuitBreaker
from ..call import Call, MethodSetup, Service
from ..classify import CircuitOpenError, ErrorClass, classify


class CircuitBreakerLayer:
    """Admits calls through a :class:`~guarded.breaker.CircuitBreaker` and records their results.

    Bad-data rejections are the caller's fault, not the backend's: they release the admission
    without counting as a failure.
    """

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        breaker = self.breaker

        async def guarded_by_breaker(call: Call) -> Any:
            ticket = breaker.allow()
            if ticket is None:
                raise CircuitOpenError(f"circuit open for store {method.store_name!r}")
            try:
                result = await inner(call)
            except Exception as exc:
                if classify(exc) is ErrorClass.REJECTED:
                    breaker.release(ticket)
                else:
                    breaker.record(ticket, failed=True, duration=call.loop.time() - call.started)
                raise
            except BaseException:
                breaker.release(ticket)
                raise
            breaker.record(ticket, failed=False, duration=call.loop.time() - call.started)
            return result

        return guarded_by_breaker
