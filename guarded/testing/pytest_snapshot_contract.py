"""The SnapshotStore contract suite as a pytest mixin: write a ``snapshot_store`` fixture (a fresh,
empty store per test, sync or async), subclass :class:`SnapshotStoreContract`, done.

One parametrized test per contract, ``test_snapshot_contract[gc_blobs]``. Requires
``pytest-asyncio`` (strict mode is fine).
"""

from __future__ import annotations

from typing import Any

import pytest

from .contract import ContractStatus
from .snapshot_contract import SNAPSHOT_CONTRACTS, SnapshotContract, run_snapshot_contract


class SnapshotStoreContract:
    """Mixin running every contract of :mod:`guarded.testing.snapshot_contract`."""

    @pytest.mark.asyncio
    @pytest.mark.parametrize("contract", SNAPSHOT_CONTRACTS, ids=[item.name for item in SNAPSHOT_CONTRACTS])
    async def test_snapshot_contract(self, snapshot_store: Any, contract: SnapshotContract) -> None:
        result = await run_snapshot_contract(snapshot_store, contract)
        if result.status is ContractStatus.ERROR and result.exception is not None:
            raise result.exception
        if result.status is not ContractStatus.PASSED:
            pytest.fail(f"{contract.name}: {result.message}", pytrace=False)


__all__ = ["SnapshotStoreContract"]
