"""Two guards of different names given one spill path, over stores that do not say where they
write (no ``target_identity``): neither replays the other's held writes into its own backend (an
adversarial review found tenant_a's write replayed into tenant_b's database)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

pytestmark = pytest.mark.asyncio


async def test_a_held_write_is_replayed_only_into_the_store_of_its_guards_name(tmp_path: Path) -> None:
    spill = str(tmp_path / "shared.sqlite")
    a_backend, b_backend = InMemoryStateStore(), InMemoryStateStore()
    down = FaultyStore(a_backend, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    a = guard(
        down,
        name="tenant_a",
        registry=CollectorRegistry(),
        spill_path=spill,
        dead_letter={"drain_timeout": 0},  # closed without trying the store again
    )
    async with a:
        await a.save_memory_state("a-key", {"owner": "tenant_a"})
        assert controller(a).dead_letters is not None

    b = guard(b_backend, name="tenant_b", registry=CollectorRegistry(), spill_path=spill)
    async with b:
        await b.save_memory_state("b-key", {"owner": "tenant_b"})
        assert await controller(b).drain(2) == 0
    assert await b_backend.load_memory_state("a-key") is None, "tenant_a's write reached tenant_b"
    assert await b_backend.load_memory_state("b-key") == {"owner": "tenant_b"}

    fault_injector(down).plan = FaultPlan()  # tenant_a's backend is back: its next process delivers
    a_again = guard(down, name="tenant_a", registry=CollectorRegistry(), spill_path=spill)
    async with a_again:
        assert await controller(a_again).drain(5) == 0
    assert await a_backend.load_memory_state("a-key") == {"owner": "tenant_a"}
