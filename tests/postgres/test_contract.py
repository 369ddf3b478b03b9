"""The whole contract suite against PostgresStateStore on a real server."""

from __future__ import annotations

import pytest_asyncio

from guarded.backends.postgres import PostgresStateStore
from guarded.codec import penguiflow_types
from guarded.testing import StateStoreContract

from .conftest import StoreFactory


class TestPostgresStore(StateStoreContract):
    """Every contract of :mod:`guarded.testing.contract`; the ``store`` fixture is in conftest."""


class TestPostgresStoreReturningPenguiFlowTypes(StateStoreContract):
    """The same contracts when reads build PenguiFlow's own classes (``types=penguiflow_types()``)."""

    @pytest_asyncio.fixture
    async def store(self, make_store: StoreFactory) -> PostgresStateStore:
        return await make_store(types=penguiflow_types())
