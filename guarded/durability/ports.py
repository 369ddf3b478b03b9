"""The ports of one guard's durability, together, and what the durability reads of the guard.

:class:`~guarded.durability.owner.Durability` owns the batcher, the dead-letter buffer, the
lifecycle and the replay; a layer gets only the ports it uses, each a few bound methods, defined
beside what they are views of: the batcher's :class:`~guarded.batching.batching_layer.WriteQueue`,
the dead-letter buffer's :class:`~guarded.deadletter.buffer_ports.Lifecycle`,
:class:`~guarded.deadletter.buffer_ports.HeldWriteKeeper`,
:class:`~guarded.deadletter.buffer_ports.HeldWriteLookups` and
:class:`~guarded.deadletter.buffer_ports.DirectWriteGate`.

The other way, the durability receives from the guard only its internal call (breaker, retry,
timeout) and the circuit breaker's wait (:class:`BreakerWait`), both passed down when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..batching.batching_layer import WriteQueue
from ..deadletter.buffer_ports import DirectWriteGate, HeldWriteKeeper, HeldWriteLookups, Lifecycle


class BreakerWait(Protocol):
    """What the durability reads of the guard's circuit breaker
    (:class:`~guarded.layers.breaker.CircuitBreaker`): replays and drains wait while it refuses
    calls, and a drain at shutdown may end its wait early."""

    def remaining_open(self) -> float:
        """Seconds the breaker still refuses every call (0 when it lets calls or probes through;
        infinite when an operator forced it open)."""
        ...

    def probe_now(self) -> None:
        """End an open breaker's wait: it lets probes through at once."""
        ...


@dataclass(frozen=True, slots=True)
class DurabilityPorts:
    """Every port of one guard's durability; ``None`` where the part is off (no batcher, no
    dead-letter buffer)."""

    lifecycle: Lifecycle
    next_stamp: Callable[[], int]
    """Call-order stamps: a direct write supersedes held writes of its key with older stamps."""
    queue: WriteQueue | None
    keeper: HeldWriteKeeper | None
    lookups: HeldWriteLookups | None
    gate: DirectWriteGate | None


__all__ = ["BreakerWait", "DurabilityPorts"]
