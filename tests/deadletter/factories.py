"""Store factories for ``guarded dlq replay --store tests.deadletter.factories:...``."""

from __future__ import annotations

from guarded.backends.memory import InMemoryStateStore
from guarded.testing import Fault, FaultPlan, FaultyStore

BUILT: list[InMemoryStateStore] = []
"""Every store the factories built, newest last."""


def memory_store() -> InMemoryStateStore:
    store = InMemoryStateStore()
    BUILT.append(store)
    return store


async def async_memory_store() -> InMemoryStateStore:
    return memory_store()


def down_store() -> object:
    return FaultyStore(memory_store(), FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
