"""Call-check layer: a call the caller got wrong never enters the rest of the chain.

Placed right inside the fallback layer, it refuses a call whose arguments do not bind or have the
wrong type (:mod:`guarded.pipeline.call_check`) with :class:`~guarded.errors.CallerError`, raised as the
call is made, before stale reads, the dead-letter buffer, batching or the backend see it: the
fallback layer ends it ``rejected``. It adds no frame: its service is a plain function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..pipeline.call import MethodSetup, Service
from ..pipeline.call_check import argument_check, call_hook
from ..pipeline.steps import Step, StepLayer


class CallCheckLayer(StepLayer):
    """Checks each call of a method of ``target`` against the method's signature and argument types."""

    def __init__(self, target: object) -> None:
        self._target = target

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        check = self._check(method)
        if check is None:
            return None

        return Step(enter=call_hook(check))

    def _check(self, method: MethodSetup) -> Callable[[tuple[Any, ...], Mapping[str, Any]], None] | None:
        try:
            backend_method = getattr(self._target, method.policy.name, None)
        except Exception:  # an attribute that fails to evaluate: the protocol's signature then
            backend_method = None
        return argument_check(method.label, backend_method, method.policy)
