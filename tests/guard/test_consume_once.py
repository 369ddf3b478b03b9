"""Consume once, really, against an in-memory store.

Each pause payload is delivered to exactly one caller and none is lost, through resumes that time
out, are cancelled by their caller, or lose their answer after the backend consumed the token; a
key belongs to one logical resume (the guard's retries of it, or the caller's own retries with
its own key) and is never inherited by another resume; a pause held in the dead-letter buffer
leaves it only with a resume that returned it. The same scenarios against PostgreSQL are in
tests/postgres/test_consume_once.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backend import current_idempotency_key, current_unanswered_keys
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, DeadLetterConfig, StaleConfig
from guarded.guard import controller, guard
from guarded.pipeline.idempotency import idempotency_key, unanswered_keys
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.aio import eventually_async

from .support import fast_config

TOKENS = 10
CONCURRENT = 4
LOST = FaultPlan.always(Fault.error_after(ConnectionResetError), methods=["load_planner_state"])
HANGS = FaultPlan.always(Fault.hang(), methods=["load_planner_state"])
SAVES_FAIL = FaultPlan.always(Fault.error_before(ConnectionRefusedError), methods=["save_planner_state"])


class KeyedPauses(InMemoryStateStore):
    """The PostgreSQL consume rules in memory: a consume with a key marks the pause consumed by that
    key; a repeat with the same key within ``consume_grace`` is answered again; a consume given
    unanswered keys takes a pause consumed by one of them (within the grace period) for its own key.
    ``answer_delay`` delays every answer after the consume (a slow way back)."""

    honours_idempotency_key = True
    recovers_unanswered_consumes = True
    consume_grace = 60.0

    def __init__(self) -> None:
        super().__init__()
        self.consumed: dict[str, tuple[str, float, dict[str, Any]]] = {}
        self.keys: list[str | None] = []
        self.answer_delay = 0.0

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        self.consumed.pop(token, None)
        await super().save_planner_state(token, payload)

    async def save_planner_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for token, _ in items:
            self.consumed.pop(token, None)
        await super().save_planner_states(items)

    def _within_grace(self, since: float) -> bool:
        return time.monotonic() - since <= self.consume_grace

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # the way there: concurrent consumes overlap
        result = self._consume(token, current_idempotency_key(), current_unanswered_keys())
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        return result

    def _consume(self, token: str, key: str | None, unanswered: tuple[str, ...]) -> dict[str, Any] | None:
        self.keys.append(key)
        found = self.consumed.get(token)
        if key is not None and found is not None and self._within_grace(found[1]):
            if found[0] in unanswered:  # recovered: now this key's
                self.consumed[token] = (key, time.monotonic(), found[2])
                return found[2]
            if found[0] == key:  # a retry of the same call
                return found[2]
        entry = self._planner_state.pop(token, None)  # no await: atomic
        if entry is None:
            return None
        payload: dict[str, Any] = json.loads(entry[1])
        if key is not None:
            self.consumed[token] = (key, time.monotonic(), payload)
        return payload


class CannotRecover(KeyedPauses):
    """Honours keys, but not unanswered keys."""

    recovers_unanswered_consumes = False


def payload(token: str) -> dict[str, Any]:
    return {"token": token}


def delivered(results: Iterable[object]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for result in results:
        if isinstance(result, dict):
            assert result == payload(result["token"])
            counts[result["token"]] += 1
    return counts


def once_each(tokens: Iterable[str]) -> Counter[str]:
    return Counter({token: 1 for token in tokens})


async def resume_concurrently(store: Any, tokens: Iterable[str], per_token: int = CONCURRENT) -> list[Any]:
    return await asyncio.gather(
        *(store.load_planner_state(token) for token in tokens for _ in range(per_token))
    )


async def gave_up(resume: Awaitable[Any], seconds: float) -> object:
    try:
        return await asyncio.wait_for(resume, seconds)
    except TimeoutError as exc:
        return exc


async def saved(backend: InMemoryStateStore, count: int = TOKENS) -> list[str]:
    tokens = [f"pause-{index}" for index in range(count)]
    for token in tokens:
        await backend.save_planner_state(token, payload(token))
    return tokens


def guarded(
    backend: InMemoryStateStore, plan: FaultPlan | None = None, **config: Any
) -> tuple[Any, FaultyStore]:
    faulty = FaultyStore(backend, plan or FaultPlan())
    return guard(faulty, registry=CollectorRegistry(), config=fast_config(**config)), faulty


# --- finding 1 ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_resumes_that_timed_out_leave_each_pause_to_exactly_one_later_resume() -> None:
    backend = KeyedPauses()
    tokens = await saved(backend)
    store, faulty = guarded(backend, HANGS)
    assert await asyncio.gather(*(store.load_planner_state(token) for token in tokens)) == [None] * TOKENS
    assert controller(store).stats()[("load_planner_state", "timeout")] == TOKENS

    fault_injector(faulty).plan = FaultPlan()
    assert delivered(await resume_concurrently(store, tokens)) == once_each(tokens)
    assert delivered(await resume_concurrently(store, tokens)) == Counter()


@pytest.mark.asyncio
async def test_lost_answers_go_to_exactly_one_later_resume_under_its_own_key() -> None:
    backend = KeyedPauses()
    tokens = await saved(backend)
    store, faulty = guarded(backend, LOST)
    assert await asyncio.gather(*(store.load_planner_state(token) for token in tokens)) == [None] * TOKENS
    lost_keys = set(backend.keys)
    assert len(lost_keys) == TOKENS  # one key per logical resume, reused by its 3 attempts
    assert len(backend.keys) == 3 * TOKENS
    assert backend.consumed.keys() == set(tokens)  # consumed, answered to nobody

    fault_injector(faulty).plan = FaultPlan()
    backend.keys.clear()
    assert delivered(await resume_concurrently(store, tokens)) == once_each(tokens)
    assert lost_keys.isdisjoint(backend.keys)  # no later resume inherited a key
    assert {key for key, _, _ in backend.consumed.values()}.isdisjoint(lost_keys)
    for key in lost_keys:  # and the old keys no longer get the payload either
        with idempotency_key(key):
            assert delivered([await backend.load_planner_state(token) for token in tokens]) == Counter()


@pytest.mark.asyncio
async def test_a_consume_committed_after_its_caller_gave_up_goes_to_exactly_one_later_resume() -> None:
    backend = KeyedPauses()
    tokens = await saved(backend)
    store, _ = guarded(backend, attempt=0.5, deadline=0.5)
    backend.answer_delay = 0.3
    given_up = await asyncio.gather(*(gave_up(store.load_planner_state(token), 0.1) for token in tokens))
    assert all(isinstance(result, TimeoutError) for result in given_up)
    assert controller(store).stats()[("load_planner_state", "cancelled")] == TOKENS
    backend.answer_delay = 0.0
    assert delivered(await resume_concurrently(store, tokens)) == once_each(tokens)


@pytest.mark.asyncio
async def test_a_resume_that_recovers_and_loses_its_answer_again_leaves_it_to_the_next() -> None:
    backend = KeyedPauses()
    tokens = await saved(backend, 1)
    store, faulty = guarded(backend, LOST)
    assert await store.load_planner_state(tokens[0]) is None
    assert await store.load_planner_state(tokens[0]) is None  # recovered it, lost the answer again
    assert len(set(backend.keys)) == 2
    fault_injector(faulty).plan = FaultPlan()
    assert delivered(await resume_concurrently(store, tokens)) == once_each(tokens)


@pytest.mark.asyncio
async def test_a_callers_own_key_is_answered_again_only_to_that_caller() -> None:
    backend = KeyedPauses()
    tokens = await saved(backend, 1)
    store, faulty = guarded(backend, LOST)
    with idempotency_key("request-1"):
        assert await store.load_planner_state(tokens[0]) is None
    assert set(backend.keys) == {"request-1"}  # the caller's key, for each attempt
    fault_injector(faulty).plan = FaultPlan()
    assert await resume_concurrently(store, tokens) == [None] * CONCURRENT  # not handed to others
    with idempotency_key("request-2"):
        assert await store.load_planner_state(tokens[0]) is None
    with idempotency_key("request-1"):
        assert await store.load_planner_state(tokens[0]) == payload(tokens[0])  # its retry
        assert current_idempotency_key() == "request-1"
    assert current_idempotency_key() is None


@pytest.mark.asyncio
async def test_a_backend_that_cannot_recover_never_hands_a_payload_out_twice() -> None:
    """Without recovery the guard never reuses a key across resumes: a payload whose every answer
    was lost stays with its key (retried within the call only), nobody gets it twice."""
    backend = CannotRecover()
    tokens = await saved(backend)
    store, faulty = guarded(backend, LOST)
    assert await asyncio.gather(*(store.load_planner_state(token) for token in tokens)) == [None] * TOKENS
    fault_injector(faulty).plan = FaultPlan()
    backend.keys.clear()
    assert await resume_concurrently(store, tokens) == [None] * TOKENS * CONCURRENT
    assert len(set(backend.keys)) == TOKENS * CONCURRENT


@pytest.mark.asyncio
async def test_every_pause_is_delivered_exactly_once_through_random_faults_and_cancellations() -> None:
    rng = random.Random(2026)
    backend = KeyedPauses()
    tokens = await saved(backend, 40)
    plan = FaultPlan.random(
        7, error_after=0.3, hang=0.15, delay=0.2, delay_range=(0.01, 0.1), methods=["load_planner_state"]
    )
    store, faulty = guarded(backend, plan, attempt=0.05, deadline=0.15)
    results: list[object] = []
    for _ in range(5):
        resumes = []
        for token in tokens:
            for _ in range(rng.randint(0, 3)):
                if rng.random() < 0.3:
                    resumes.append(gave_up(store.load_planner_state(token), rng.uniform(0.005, 0.1)))
                else:
                    resumes.append(store.load_planner_state(token))
        rng.shuffle(resumes)
        results += await asyncio.gather(*resumes)
    fault_injector(faulty).plan = FaultPlan()
    fault_injector(faulty).release()
    await asyncio.sleep(0.05)
    for _ in range(2):
        results += await resume_concurrently(store, tokens)
    assert delivered(results) == once_each(tokens)
    assert not backend._planner_state  # none left unconsumed


# --- finding 2 ------------------------------------------------------------------------------------


def durable(tmp_path: Path | None, **config: Any) -> dict[str, Any]:
    return {
        "batching": BatchConfig(enabled=False),
        "dead_letter": DeadLetterConfig(path=None if tmp_path is None else str(tmp_path / "dlq.sqlite")),
        "stale": StaleConfig(),
        **config,
    }


async def held(tmp_path: Path | None, count: int = TOKENS) -> tuple[Any, FaultyStore, KeyedPauses, list[str]]:
    backend = KeyedPauses()
    store, faulty = guarded(backend, SAVES_FAIL, **durable(tmp_path, attempt=0.5, deadline=0.5))
    tokens = [f"held-{index}" for index in range(count)]
    for token in tokens:
        await store.save_planner_state(token, payload(token))
    assert controller(store).stats()[("save_planner_state", "dead_lettered")] == count
    return store, faulty, backend, tokens


async def still_held(store: Any, tokens: Iterable[str]) -> list[bool]:
    buffer = controller(store).dead_letters
    assert buffer is not None
    return [await buffer.latest_for_key("save_planner_state", token) is not None for token in tokens]


async def _none_held(store: Any, tokens: list[str]) -> bool:
    return not any(await still_held(store, tokens))


@pytest.mark.asyncio
@pytest.mark.parametrize("spill", [False, True], ids=["memory", "spill-file"])
@pytest.mark.parametrize("hanging", ["save_planner_state", "load_planner_state"])
async def test_a_held_pause_whose_resume_is_cancelled_stays_for_the_next_resume(
    tmp_path: Path, spill: bool, hanging: str
) -> None:
    """The resume gives up while the held save is being delivered to the backend (it stays held),
    or while the backend consumes after the held save was delivered (it waits there)."""
    store, faulty, backend, tokens = await held(tmp_path if spill else None)
    fault_injector(faulty).plan = FaultPlan.always(Fault.hang(), methods=[hanging])
    given_up = await asyncio.gather(*(gave_up(store.load_planner_state(token), 0.1) for token in tokens))
    assert all(isinstance(result, TimeoutError) for result in given_up)
    delivered_first = hanging == "load_planner_state"
    assert await still_held(store, tokens) == [not delivered_first] * TOKENS
    assert sorted(backend._planner_state) == (sorted(tokens) if delivered_first else [])

    # Saves fail, the backend answers: it is the truth (None for a hold not delivered yet, which
    # waits for its replay; the payload for one delivered before the consume hung).
    fault_injector(faulty).plan = SAVES_FAIL
    results = await resume_concurrently(store, tokens)
    fault_injector(faulty).plan = FaultPlan()
    assert await controller(store).drain(timeout=5) == 0
    results += await resume_concurrently(store, tokens)
    assert delivered(results) == once_each(tokens)
    assert await _none_held(store, tokens)
    assert delivered(await resume_concurrently(store, tokens)) == Counter()  # never again
    assert not backend._planner_state


@pytest.mark.asyncio
async def test_concurrent_resumes_of_a_held_pause_deliver_it_once_whoever_gives_up() -> None:
    store, faulty, _, tokens = await held(None)
    fault_injector(faulty).plan = FaultPlan.always(Fault.delay(0.2), methods=["load_planner_state"])
    first = [asyncio.ensure_future(gave_up(store.load_planner_state(token), 0.1)) for token in tokens]
    await asyncio.sleep(0.01)  # the callers that give up reach the held pauses first
    results = await asyncio.gather(
        *first,
        *(gave_up(store.load_planner_state(token), 0.15) for token in tokens),
        *(store.load_planner_state(token) for token in tokens for _ in range(2)),
    )
    fault_injector(faulty).plan = FaultPlan()
    results += await resume_concurrently(store, tokens)
    assert delivered(results) == once_each(tokens)


@pytest.mark.asyncio
async def test_a_held_pause_is_answered_when_the_backend_fails_and_removed_after() -> None:
    store, faulty, _, tokens = await held(None, 1)
    fault_injector(faulty).plan = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
    assert await store.load_planner_state(tokens[0]) == payload(tokens[0])
    assert controller(store).stats()[("load_planner_state", "stale")] == 1
    await eventually_async(lambda: _none_held(store, tokens), what="the answered pause removed")
    assert await store.load_planner_state(tokens[0]) is None


@pytest.mark.asyncio
async def test_keys_of_an_outer_context_never_reach_a_consume_that_claims_none() -> None:
    """A consume run where unanswered keys are already set (inside another consume's context, say)
    and that claims none of its own sends none: it cannot recover a payload consumed under a key
    it was never given; the outer keys are back after it."""
    backend = KeyedPauses()
    tokens = await saved(backend, 2)
    store, _ = guarded(backend)
    seen: list[tuple[str, ...]] = []
    consume = backend._consume

    def recording(token: str, key: str | None, unanswered: tuple[str, ...]) -> Any:
        seen.append(unanswered)
        return consume(token, key, unanswered)

    backend._consume = recording  # type: ignore[method-assign]
    with unanswered_keys(("someone-else",)):
        assert await store.load_planner_state(tokens[0]) == payload(tokens[0])
        assert current_unanswered_keys() == ("someone-else",)
    assert await store.load_planner_state(tokens[1]) == payload(tokens[1])
    assert seen == [(), ()]
