"""Options a user gets wrong are refused with what was meant: a misspelled
option of ``connect`` / ``lazy`` / ``from_pool`` names the closest valid one instead of being
ignored, and ``pool=`` takes a :class:`PoolSettings` or a mapping of its fields."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from guarded.backends.postgres import PoolSettings, PostgresStateStore


@pytest.mark.asyncio
async def test_a_misspelled_option_names_the_closest_valid_one(pg_dsn: str, schema_name: str) -> None:
    options: dict[str, Any] = {"pause_tll": 10}
    with pytest.raises(TypeError, match=r"unknown option 'pause_tll' \(did you mean 'pause_ttl'\?\)"):
        await PostgresStateStore.connect(pg_dsn, schema=schema_name, **options)
    with pytest.raises(TypeError, match=r"PostgresStateStore.lazy\(\) got an unknown option 'pause_tll'"):
        PostgresStateStore.lazy(pg_dsn, schema=schema_name, **options)
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
    try:
        with pytest.raises(TypeError, match=r"unknown option 'retension' \(did you mean 'retention'\?\)"):
            await PostgresStateStore.from_pool(pool, schema=schema_name, **{"retension": None})
    finally:
        await pool.close()
    with pytest.raises(TypeError, match=r"unknown option 'colour'; options: artifact_retention, "):
        PostgresStateStore.lazy(pg_dsn, schema=schema_name, **{"colour": "blue"})


@pytest.mark.asyncio
async def test_pool_takes_settings_or_a_mapping_of_their_fields(pg_dsn: str, schema_name: str) -> None:
    store = await PostgresStateStore.connect(pg_dsn, schema=schema_name, pool={"max_size": 3, "min_size": 1})
    try:
        assert store.max_concurrency == 3
        await store.save_memory_state("k", {"v": 1})
        assert await store.load_memory_state("k") == {"v": 1}
    finally:
        await store.close()
    lazy = PostgresStateStore.lazy(pg_dsn, schema=schema_name, pool=PoolSettings(max_size=4))
    assert lazy.max_concurrency == 4
    with pytest.raises(
        TypeError, match=r"lazy\(\) pool= got an unknown option 'max_szie' \(did you mean 'max_size'"
    ):
        PostgresStateStore.lazy(pg_dsn, schema=schema_name, pool={"max_szie": 5})
    with pytest.raises(
        TypeError, match=r"takes a PoolSettings or a mapping of its fields \(min_size, max_size"
    ):
        PostgresStateStore.lazy(pg_dsn, schema=schema_name, pool=5)  # type: ignore[arg-type]
