"""The ``memory_keys.session_keys`` contract fails a store that lists the wrong keys."""

from __future__ import annotations

import pytest

from guarded.backends.memory import InMemoryStateStore
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
