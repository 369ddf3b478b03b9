"""``list_memory_keys``: the contract fails a store that lists the wrong keys, and ``guard()``
passes the capability through (an explicit read policy, the same ``hasattr`` answer)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.policy import Kind
from guarded.policy_table import PolicyTable
from guarded.protocol import SupportsMemoryKeys, capabilities
from guarded.testing.contract import ContractStatus, run_contracts


class ListsEveryKey(InMemoryStateStore):
    async def list_memory_keys(self, session_id: str) -> list[str]:
        return sorted(self._memory_state)


class ListsUnsorted(InMemoryStateStore):
    async def list_memory_keys(self, session_id: str) -> list[str]:
        return (await super().list_memory_keys(session_id))[::-1]


class MatchesBySubstring(InMemoryStateStore):
    async def list_memory_keys(self, session_id: str) -> list[str]:
        return sorted(key for key in self._memory_state if session_id in key)


async def status_of(store: object) -> ContractStatus:
    report = await run_contracts(store, only=["memory_keys.session_keys"])
    [result] = report.results
    return result.status


@pytest.mark.asyncio
async def test_the_reference_store_passes() -> None:
    assert await status_of(InMemoryStateStore()) is ContractStatus.PASSED


@pytest.mark.asyncio
@pytest.mark.parametrize("store", [ListsEveryKey, ListsUnsorted, MatchesBySubstring])
async def test_a_wrong_listing_fails(store: type[InMemoryStateStore]) -> None:
    assert await status_of(store()) is ContractStatus.FAILED


@pytest.mark.asyncio
async def test_a_store_without_the_method_is_not_offered() -> None:
    assert await status_of(_CoreOnly()) is ContractStatus.NOT_OFFERED


class _CoreOnly:
    async def save_event(self, event: object) -> None: ...
    async def load_history(self, trace_id: str) -> list[object]:
        return []

    async def save_remote_binding(self, binding: object) -> None: ...


@pytest.mark.asyncio
async def test_the_guard_passes_the_capability_through() -> None:
    policy = PolicyTable.for_state_store().get("list_memory_keys")
    assert (policy.kind, policy.inferred) == (Kind.READ, False)
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), spill_path=None)
    try:
        assert isinstance(store, SupportsMemoryKeys)
        assert "memory_keys" in capabilities(store)
        assert "list_memory_keys" in controller(store).guarded_methods()
        await store.save_memory_state("acme:u1:s1", {"turns": []})
        assert await store.list_memory_keys("s1") == ["acme:u1:s1"]
        assert await status_of(store) is ContractStatus.PASSED
    finally:
        await controller(store).aclose()
    bare = guard(_CoreOnly(), registry=CollectorRegistry(), spill_path=None)
    try:
        assert not hasattr(bare, "list_memory_keys")
        assert "memory_keys" not in capabilities(bare)
    finally:
        await controller(bare).aclose()
