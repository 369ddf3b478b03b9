"""Planner pauses on every durable store: consume once, a retry with the same idempotency key
answered again within ``consume_grace``, a resume whose answer was lost answered to the next one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import GuardConfig, RetryConfig
from guarded.guard import guard
from guarded.pipeline.idempotency import idempotency_key
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector


@pytest.mark.asyncio
async def test_a_retry_with_the_same_key_gets_the_payload_again(store: Any) -> None:
    await store.save_planner_state("tok", {"trajectory": {"steps": []}})
    with idempotency_key("call-1"):
        first = await store.load_planner_state("tok")
        retry = await store.load_planner_state("tok")  # the response of `first` was "lost"
    assert first == retry == {"trajectory": {"steps": []}}
    with idempotency_key("call-2"):
        assert await store.load_planner_state("tok") is None
    assert await store.load_planner_state("tok") is None  # no key: nobody can repeat


@pytest.mark.asyncio
async def test_the_grace_period_ends(make_durable_store: Any) -> None:
    store = await make_durable_store(consume_grace=0.3)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        await asyncio.sleep(0.45)
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_zero_grace_disables_repeats(make_durable_store: Any) -> None:
    store = await make_durable_store(consume_grace=0)
    await store.save_planner_state("tok", {"x": 1})
    with idempotency_key("call"):
        assert await store.load_planner_state("tok") == {"x": 1}
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_saving_a_consumed_token_again_makes_it_loadable(store: Any) -> None:
    await store.save_planner_state("tok", {"v": 1})
    with idempotency_key("a"):
        assert await store.load_planner_state("tok") == {"v": 1}
    await store.save_planner_state("tok", {"v": 2})
    with idempotency_key("b"):
        assert await store.load_planner_state("tok") == {"v": 2}
    with idempotency_key("a"):
        assert await store.load_planner_state("tok") is None


@pytest.mark.asyncio
async def test_concurrent_consumers_exactly_one_wins(make_durable_store: Any) -> None:
    writer = await make_durable_store()
    readers = [await make_durable_store() for _ in range(3)]  # separate pools: real concurrency
    for round_number in range(5):
        token = f"tok-{round_number}"
        await writer.save_planner_state(token, {"round": round_number})

        async def consume(reader: Any, key: str | None, token: str = token) -> object:
            with idempotency_key(key):
                return await reader.load_planner_state(token)

        results = await asyncio.gather(
            *(consume(readers[index % 3], None if index % 4 == 0 else f"key-{index}") for index in range(12))
        )
        assert [result for result in results if result is not None] == [{"round": round_number}]


@pytest.mark.asyncio
async def test_a_retry_racing_its_own_first_attempt_gets_the_payload(make_durable_store: Any) -> None:
    stores = [await make_durable_store() for _ in range(2)]
    for round_number in range(10):
        token = f"race-{round_number}"
        await stores[0].save_planner_state(token, {"round": round_number})
        with idempotency_key(f"call-{round_number}"):
            first, retry = await asyncio.gather(
                stores[0].load_planner_state(token), stores[1].load_planner_state(token)
            )
        assert first == retry == {"round": round_number}


@pytest.mark.asyncio
async def test_a_resume_whose_answer_was_lost_is_answered_to_the_next_resume(make_durable_store: Any) -> None:
    """The store consumed the pause but every attempt's answer was lost: the next resume of the
    token recovers it under its own key (within ``consume_grace``); the unanswered key is never
    reused (tests/postgres/test_consume_once.py)."""
    backend = await make_durable_store()
    faulty = FaultyStore(backend, FaultPlan.always(Fault.error_after(ConnectionResetError)))
    config = GuardConfig(retry=RetryConfig(max_attempts=2, critical_max_attempts=2, initial_backoff=0.001))
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    await backend.save_planner_state("tok", {"step": 1})
    assert await store.load_planner_state("tok") is None  # consumed, answer lost twice
    assert await backend.load_planner_state("tok") is None  # consumed for anyone else

    fault_injector(faulty).plan = FaultPlan()
    assert await store.load_planner_state("tok") == {"step": 1}
    assert await store.load_planner_state("tok") is None  # answered once: not again
