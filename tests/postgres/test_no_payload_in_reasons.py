"""On ``guard(PostgresStateStore)`` against a real server: no payload in any
parked reason, log record or metric (the store's own metrics included).

See :mod:`tests.guard._payload_secrets` for the refused calls (every write method, the secret in
keys, values, ids and numbers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.guard import guard
from tests.guard._payload_secrets import exercise, guard_config

from .conftest import StoreFactory


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_no_secret_in_parked_reasons_logs_or_metrics(
    make_store: StoreFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    backend = await make_store(registry=registry)
    async with guard(backend, registry=registry, config=guard_config(str(tmp_path / "dlq.sqlite"))) as store:
        await exercise(store, registry, caplog)
