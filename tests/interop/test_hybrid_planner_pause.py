"""PenguiFlow's ``ReactPlanner`` pauses in one process and resumes in another through
``guard(HybridStateStore)``: the pause in Redis (spec 000's hybrid), the rest in PostgreSQL.

Each process is a real subprocess (tests/interop/_planner_worker.py ``--redis-url``); the pause is
consumed once across processes: a third process resuming the same token finds nothing.
"""

from __future__ import annotations

import pytest
from redis import asyncio as redis_asyncio

from guarded.testing.redis import RedisServer
from tests.redis.conftest import new_prefix

from .test_planner_pause import assert_finished, assert_paused, explain, worker


@pytest.mark.asyncio
async def test_pause_in_one_process_resume_in_another_through_the_hybrid(
    pg_dsn: str, schema_name: str, redis_server: RedisServer
) -> None:
    prefix = new_prefix()
    hybrid = ["--redis-url", redis_server.url, "--prefix", prefix]
    paused = await worker("pause", pg_dsn, schema_name, extra=hybrid)
    token = assert_paused(paused)
    # PenguiFlow saves each pause twice under its token (see test_planner_pause.py).
    assert paused["calls"] == {"save_planner_state:ok": 2}, explain(paused)
    assert paused["held_after_close"] == 0, explain(paused)
    client = redis_asyncio.Redis.from_url(redis_server.url)
    try:
        kept = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    finally:
        await client.aclose()
    assert kept, "the pause must be in Redis, under the hybrid's prefix"

    resumed = await worker("resume", pg_dsn, schema_name, token=token, extra=hybrid)
    assert_finished(resumed)
    assert resumed["calls"] == {"load_planner_state:ok": 1}, explain(resumed)

    again = await worker("resume", pg_dsn, schema_name, token=token, extra=hybrid)
    assert again["result"] == "resume_failed", explain(again)  # consumed once, across processes
    assert again["calls"] == {"load_planner_state:not_found": 1}, explain(again)
