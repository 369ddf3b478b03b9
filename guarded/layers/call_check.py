"""Call-check layer: a call the caller got wrong never enters the rest of the chain.

Placed right inside the fallback layer, it refuses a call whose arguments do not bind or have the
wrong type (:mod:`guarded.call_check`) with :class:`~guarded.errors.CallerError`, raised as the
call is made, before stale reads, the dead-letter buffer, batching or the backend see it: the
fallback layer ends it ``rejected``. It adds no frame: its service is a plain function.
"""

from __future__ import annotations

from typing import Any

from ..call import Call, MethodSetup, Service
from ..call_check import argument_check


class CallCheckLayer:
    """Checks each call of a method of ``target`` against the method's signature and argument types."""

    def __init__(self, target: object) -> None:
        self._target = target

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        try:
            backend_method = getattr(self._target, method.policy.name, None)
        except Exception:  # an attribute that fails to evaluate: the protocol's signature then
            backend_method = None
        check = argument_check(method.label, backend_method, method.policy)
        if check is None:
            return inner

        def checked(call: Call) -> Any:
            check(call.args, call.kwargs)
            return inner(call)

        return checked
