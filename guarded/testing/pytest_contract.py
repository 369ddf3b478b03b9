"""The contract suite as a pytest mixin: write a ``store`` fixture, subclass, done.

.. code-block:: python

    import pytest
    from guarded.testing import StateStoreContract

    @pytest.fixture
    def store():
        return MyStore()

    class TestMyStore(StateStoreContract):
        pass

One parametrized test per contract, ``test_contract[planner_state.consume_once]``; contracts
of capabilities the store does not offer are skipped with the reason. The ``store`` fixture
may be sync or async (``pytest_asyncio.fixture``); closing the store is the fixture's job.
Requires ``pytest-asyncio`` (strict mode is fine).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from .contract import CONTRACTS, DEFAULT_TIMEOUT, Contract, ContractStatus, run_contract


class StateStoreContract:
    """Mixin running every contract of :mod:`guarded.testing.contract` against the ``store`` fixture.

    Override ``contract_timeout`` (seconds per contract) for slow backends.
    """

    contract_timeout: ClassVar[float] = DEFAULT_TIMEOUT

    @pytest.mark.asyncio
    @pytest.mark.parametrize("contract", CONTRACTS, ids=[item.name for item in CONTRACTS])
    async def test_contract(self, store: Any, contract: Contract) -> None:
        """Spec 000 "Testing Your Implementation", one contract at a time."""
        result = await run_contract(store, contract, per_contract_timeout=self.contract_timeout)
        if result.status is ContractStatus.NOT_OFFERED:
            pytest.skip(result.message)
        if result.status is ContractStatus.ERROR and result.exception is not None:
            raise result.exception
        if result.status is not ContractStatus.PASSED:
            pytest.fail(f"{contract.name}: {result.message}", pytrace=False)


__all__ = ["StateStoreContract"]
