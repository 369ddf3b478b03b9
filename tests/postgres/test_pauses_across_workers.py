"""A pause is delivered at most once across every worker, and the newest save wins, against a real PostgreSQL.

Worker B is partitioned (every pause call of its store fails with a connection error: fault
injection over a real :class:`PostgresStateStore`) while it saves a token: the save is held in its
dead-letter buffer. Worker A then saves the same token, newer, directly. Each worker is a guard with
its own store, pool and spill file, as two processes have.

* Case 1: A resumes; then B, still partitioned, resumes. B cannot know of A's consume: only a
  guard that never answers a pause from a local hold (``StaleConfig.answer_held_pauses=False``)
  delivers the token once. The default answers B's hold (outcome ``stale``): the trade-off the
  docs state, measured here.
* Case 2: B heals before anyone resumes; the user resumes on B, then on A. The backend can be
  reached, so it is the truth: B's held (older) save is delivered to it as a replay (and loses),
  and B's resume gets A's newer pause; A's gets nothing.
* Case 3: as case 2 with B's breaker opened by the partition: the resume on B is the breaker's
  probe, and the same holds.
* Finding 5: a token committed once and resumed once stays consumed through ``cleanup()`` and a
  later replay of an older held save.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.guard import controller, guard
from tests.guard.support import no_background_replay
from tests.support.pause_partition import PausePartition

TOKENS = 10


class PartitionedStore(PausePartition, PostgresStateStore):
    """A real PostgreSQL store whose pause calls fail with a connection error while ``down``."""


def worker_config(
    spill: Path, *, breaker: bool = False, answer_held_pauses: bool | None = None
) -> dict[str, Any]:
    stale: dict[str, Any] = {}
    if answer_held_pauses is not None:
        stale["answer_held_pauses"] = answer_held_pauses
    return {
        "retry": {"enabled": False},
        "timeout": {"attempt": 2.0, "deadline": 4.0, "critical_deadline": 4.0},
        "breaker": (
            {"minimum_calls": 2, "window_size": 4, "open_duration": 0.3, "half_open_probes": 1}
            if breaker
            else {"enabled": False}
        ),
        "dead_letter": {"path": str(spill)},
        "stale": stale,
    }


@pytest_asyncio.fixture
async def raw_stores(
    pg_dsn: str, schema_name: str
) -> AsyncIterator[tuple[PartitionedStore, PartitionedStore]]:
    """Worker A's store and worker B's (one schema, two pools)."""
    a = await PartitionedStore.connect(pg_dsn, schema=schema_name)
    b = await PartitionedStore.connect(pg_dsn, schema=schema_name)
    try:
        yield a, b
    finally:
        for store in (a, b):
            await store.close()


async def resume(store: Any, token: str) -> dict[str, Any] | None:
    """What a user resuming ``token`` on a worker receives (a failure delivers nothing)."""
    try:
        found: dict[str, Any] | None = await store.load_planner_state(token)
    except Exception:
        return None
    return found


async def b_holds_older_a_saves_newer(a: Any, b: Any, raw_b: PartitionedStore) -> None:
    """B, partitioned, saves every token (held); then A saves each newer, directly."""
    raw_b.down = True
    for i in range(TOKENS):
        await b.save_planner_state(f"tok{i}", {"by": "b", "version": 1})
    assert controller(b).dead_letters.depth == TOKENS
    for i in range(TOKENS):
        await a.save_planner_state(f"tok{i}", {"by": "a", "version": 2})


def deliveries(answers: list[dict[str, Any] | None]) -> int:
    return sum(answer is not None for answer in answers)


@pytest.mark.asyncio
async def test_case_1_a_strict_guard_never_answers_a_pause_from_a_hold(
    raw_stores: tuple[PartitionedStore, PartitionedStore], tmp_path: Path
) -> None:
    """A resumes, then B (still partitioned) resumes: with ``answer_held_pauses=False`` B
    answers nothing while partitioned; once healed its hold is replayed and loses to A's consume:
    every token is delivered exactly once, with A's newer payload."""
    raw_a, raw_b = raw_stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b = guard(
        raw_b,
        name="worker-b",
        registry=CollectorRegistry(),
        **worker_config(tmp_path / "b.sqlite", answer_held_pauses=False),
    )
    async with a, b:
        await b_holds_older_a_saves_newer(a, b, raw_b)
        on_a = [await resume(a, f"tok{i}") for i in range(TOKENS)]
        on_b_partitioned = [await resume(b, f"tok{i}") for i in range(TOKENS)]
        raw_b.down = False
        assert await controller(b).drain(10.0) == 0  # B's holds replayed: refused, the tokens were consumed
        again = [await resume(store, f"tok{i}") for store in (b, a) for i in range(TOKENS)]
    assert on_a == [{"by": "a", "version": 2}] * TOKENS
    assert on_b_partitioned == [None] * TOKENS
    assert again == [None] * (2 * TOKENS)
    assert deliveries(on_a + on_b_partitioned + again) == TOKENS  # exactly once each


@pytest.mark.asyncio
async def test_case_1_by_default_a_partitioned_worker_answers_its_hold_once(
    raw_stores: tuple[PartitionedStore, PartitionedStore], tmp_path: Path
) -> None:
    """The documented trade-off of the default (``answer_held_pauses=True``): B, partitioned,
    cannot know of A's consume and answers its own hold (outcome ``stale``): each token is
    delivered twice, A's newer payload then B's older one; never a third time once B heals."""
    raw_a, raw_b = raw_stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **worker_config(tmp_path / "b.sqlite"))
    async with a, b:
        await b_holds_older_a_saves_newer(a, b, raw_b)
        on_a = [await resume(a, f"tok{i}") for i in range(TOKENS)]
        on_b_partitioned = [await resume(b, f"tok{i}") for i in range(TOKENS)]
        raw_b.down = False
        assert await controller(b).drain(10.0) == 0
        again = [await resume(store, f"tok{i}") for store in (b, a) for i in range(TOKENS)]
    assert on_a == [{"by": "a", "version": 2}] * TOKENS
    assert on_b_partitioned == [{"by": "b", "version": 1}] * TOKENS
    assert again == [None] * (2 * TOKENS)
    assert deliveries(on_a + on_b_partitioned + again) == 2 * TOKENS


@pytest.mark.asyncio
async def test_case_2_a_healed_worker_resumes_the_newest_save_and_only_once(
    raw_stores: tuple[PartitionedStore, PartitionedStore], tmp_path: Path
) -> None:
    """B heals before its background replay delivered its holds (frozen here, as a slow replay
    would leave them); the user resumes on B, then on A: B's resume gets A's newer pause, A's
    gets nothing."""
    raw_a, raw_b = raw_stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **worker_config(tmp_path / "b.sqlite"))
    no_background_replay(b)
    async with a, b:
        await b_holds_older_a_saves_newer(a, b, raw_b)
        raw_b.down = False
        on_b = [await resume(b, f"tok{i}") for i in range(TOKENS)]
        on_a = [await resume(a, f"tok{i}") for i in range(TOKENS)]
        left = controller(b).dead_letters.depth
    assert on_b == [{"by": "a", "version": 2}] * TOKENS  # the newest save, from the backend
    assert on_a == [None] * TOKENS
    assert left == 0  # each hold was delivered (and lost to the newer save) by the resume


@pytest.mark.asyncio
async def test_case_3_with_b_breaker_open_the_resume_probes_the_backend(
    raw_stores: tuple[PartitionedStore, PartitionedStore], tmp_path: Path
) -> None:
    """As case 2, B's breaker opened by the partition: once it lets a probe through, the resume's
    replay of the hold is that probe; the user gets A's newer pause once."""
    raw_a, raw_b = raw_stores
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b_config = worker_config(tmp_path / "b.sqlite", breaker=True)
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **b_config)
    no_background_replay(b)
    async with a, b:
        await b_holds_older_a_saves_newer(a, b, raw_b)
        assert controller(b).breaker.state.value == "open"
        raw_b.down = False
        await asyncio.sleep(0.6)  # past the breaker's open duration (0.3 s): the next call probes
        on_b = [await resume(b, f"tok{i}") for i in range(TOKENS)]
        on_a = [await resume(a, f"tok{i}") for i in range(TOKENS)]
    assert on_b == [{"by": "a", "version": 2}] * TOKENS
    assert on_a == [None] * TOKENS


@pytest.mark.asyncio
async def test_finding_5_a_consumed_pause_stays_consumed_through_cleanup_and_a_late_replay(
    raw_stores: tuple[PartitionedStore, PartitionedStore], tmp_path: Path, pg_dsn: str, schema_name: str
) -> None:
    """Committed once, resumed once, ``cleanup()`` (past the consume grace), then B replays its
    older held save: the consume's tombstone outlives retention and refuses it."""
    raw_a, raw_b = raw_stores
    reader = await PostgresStateStore.connect(pg_dsn, schema=schema_name, consume_grace=0.01)
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **worker_config(tmp_path / "b.sqlite"))
    no_background_replay(b)
    try:
        async with a, b:
            await b_holds_older_a_saves_newer(a, b, raw_b)
            resumed = [await resume(a, f"tok{i}") for i in range(TOKENS)]
            await asyncio.sleep(0.05)  # past the consume grace
            await reader.cleanup()
            raw_b.down = False
            assert await controller(b).drain(10.0) == 0
            again = [await resume(store, f"tok{i}") for store in (a, b) for i in range(TOKENS)]
    finally:
        await reader.close()
    assert resumed == [{"by": "a", "version": 2}] * TOKENS
    assert again == [None] * (2 * TOKENS)


@pytest.mark.asyncio
async def test_finding_5_a_replay_of_a_save_that_would_have_expired_inserts_nothing(
    pg_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    """A held save's expiry counts from its call: replayed after the pause TTL (and after
    retention removed the tombstone of its consume), it brings nothing back."""
    ttl = 1.0
    raw_a = await PartitionedStore.connect(pg_dsn, schema=schema_name, pause_ttl=ttl, consume_grace=0.01)
    raw_b = await PartitionedStore.connect(pg_dsn, schema=schema_name, pause_ttl=ttl, consume_grace=0.01)
    a = guard(raw_a, name="worker-a", registry=CollectorRegistry(), **worker_config(tmp_path / "a.sqlite"))
    b = guard(raw_b, name="worker-b", registry=CollectorRegistry(), **worker_config(tmp_path / "b.sqlite"))
    no_background_replay(b)
    try:
        async with a, b:
            await b_holds_older_a_saves_newer(a, b, raw_b)
            resumed = [await resume(a, f"tok{i}") for i in range(TOKENS)]
            await asyncio.sleep(ttl + 0.5)
            report = await raw_a.cleanup()
            raw_b.down = False
            assert await controller(b).drain(10.0) == 0
            again = [await resume(store, f"tok{i}") for store in (a, b) for i in range(TOKENS)]
    finally:
        await raw_a.close()
        await raw_b.close()
    assert resumed == [{"by": "a", "version": 2}] * TOKENS
    assert report.deleted["planner_pauses"] == TOKENS  # the tombstones, once the TTL after the consume passed
    assert again == [None] * (2 * TOKENS)
