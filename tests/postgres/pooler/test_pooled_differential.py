"""PenguiFlow 3.11's reference store as the oracle of ``guard(PostgresStateStore)`` through PgBouncer.

The differential test of tests/interop/test_differential.py, through this package's fixtures:
``guard(PostgresStateStore)`` connected through PgBouncer in transaction mode with
``pooler="transaction"``, the same random call sequences (the first :data:`SEQUENCES` of its fixed
seeds), the same normalisations and the same documented exceptions. Every call's result must equal
the oracle's, as on a direct connection. Its tests of the exceptions run here unchanged.
"""

from __future__ import annotations

import pytest

from tests.interop.test_differential import (
    BASE_SEED,
    Difference,
    ReferenceWithExceptions,
    describe,
    run_sequence,
    test_exception_e1_updates_and_steering_are_idempotent_by_id,
    test_exception_e4_an_empty_pause_loads_as_none_under_the_guard,
    test_exception_e6_postgres_tasks_are_last_write_wins_by_updated_at,
    three_stores,
)

from ..conftest import StoreFactory

SEQUENCES = 8
"""Sequences of the direct test's seeds run here (1,200 random calls): a third of them, as every
call through the pooler costs about twice as much."""

RERUN_HERE = (
    test_exception_e1_updates_and_steering_are_idempotent_by_id,
    test_exception_e4_an_empty_pause_loads_as_none_under_the_guard,
    test_exception_e6_postgres_tasks_are_last_write_wins_by_updated_at,
)
"""Collected in this module: the exceptions that touch the pooled paths (idempotent inserts, a
consumed pause, last-write-wins upserts), through the pooler."""


@pytest.mark.asyncio
async def test_random_calls_through_pgbouncer_agree_with_penguiflows_reference(
    make_store: StoreFactory,
) -> None:
    differences: list[Difference] = []
    for index in range(SEQUENCES):
        stores = await three_stores(make_store, index)
        async with stores["postgres"]:
            differences += await run_sequence(BASE_SEED + index, stores, ReferenceWithExceptions())
    assert not differences, describe(differences)
