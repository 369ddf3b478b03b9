"""Memory health layer: feeds ``guarded_memory_health_keys`` from the memory states the guard
acknowledges or loads (spec 003, "Summarization Failure Handling").

It sits just inside the fallback layer, so it sees a call only as it returns normally:

* ``save_memory_state(key, state)``: the write was acknowledged: written, or held in the
  dead-letter buffer for replay (outcome ``dead_lettered``; it will be written, and a read of the
  key already answers it). A write that failed without being kept, or that the backend rejected
  as bad data, changes nothing: that state is not what the key holds.
* ``load_memory_state(key)``: hydration; the state answered (from the backend, a held write or
  the stale-if-error cache) is what the planner now runs with. ``None`` (no state) stops counting
  the key.

Which methods are concerned is read from the policy table: the memory write (by name) and any
read that answers from it (``merge_from``). Every other method gets ``inner`` back unchanged and
pays nothing; for the two concerned, the cost is a few dictionary operations. A failure of the
bookkeeping itself is logged once and never changes the call's result or outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..error_classes import error_type
from ..observability.rate_limited_log import RateLimitedLog
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer
from ..telemetry.memory_health_gauge import DEFAULT_MAX_KEYS, MemoryHealthTracker, memory_health_tracker


class MemoryHealthLayer(StepLayer):
    """Tracks the ``health`` of memory states per key for the memory health gauge: the write and the
    read of the methods whose policy says :attr:`~guarded.policy.MethodPolicy.memory_health`."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self._registry = registry
        self._max_keys = max_keys

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        policy = method.policy
        if not policy.memory_health:
            return None
        if policy.lww_key is not None and policy.value is not None:
            key_of, state_of = policy.lww_key, policy.value
            tracker = self._tracker(method)

            observe = tracker.observe

            def saved(call: Call, result: Any) -> Any:
                args, kwargs = call.args, call.kwargs
                try:
                    observe(key_of(args, kwargs), state_of(args, kwargs))
                except Exception as exc:  # the write succeeded; only the gauge is affected
                    _problem(tracker, exc)
                return result

            return Step(ok=saved)
        if policy.read_key is not None:
            read_key = policy.read_key
            tracker = self._tracker(method)

            observe_read = tracker.observe

            def loaded(call: Call, result: Any) -> Any:
                try:
                    observe_read(read_key(call.args, call.kwargs), result)
                except Exception as exc:  # the read succeeded; only the gauge is affected
                    _problem(tracker, exc)
                return result

            return Step(ok=loaded)
        return None

    def _tracker(self, method: MethodSetup) -> MemoryHealthTracker:
        return memory_health_tracker(method.store_name, self._registry, max_keys=self._max_keys)


_problems = RateLimitedLog(interval=300.0, log=logging.getLogger("guarded.telemetry"))


def _problem(tracker: MemoryHealthTracker, exc: Exception) -> None:
    _problems.log(
        (tracker.store, type(exc)),
        logging.WARNING,
        "memory health of store %r not updated: %s",
        tracker.store,
        error_type(exc),
        extra={"event": "memory_health_failed", "store": tracker.store, "error_type": error_type(exc)},
    )
