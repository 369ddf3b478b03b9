"""Consume once, really, against a real PostgreSQL.

The invariant: every pause payload is delivered to exactly one caller -- a resume that returned it
-- and none is lost, through resumes that time out, resumes whose caller gives up (cancellation),
and resumes whose answer is lost after the database consumed the token; and a pause held in the
dead-letter buffer leaves it only with an answer its caller received.

Stalls are a second connection holding ``LOCK TABLE planner_pauses IN ACCESS EXCLUSIVE MODE``
in a transaction (as tests/postgres/test_outages.py does for a slow server).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.codec import DEFAULT_TYPES
from guarded.config import (
    BatchConfig,
    BreakerConfig,
    DeadLetterConfig,
    GuardConfig,
    LoggingConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.guard import controller, guard
from guarded.pipeline.idempotency import idempotency_key, unanswered_keys
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

from .conftest import StoreFactory

POOL = PoolSettings(min_size=1, max_size=16, command_timeout=30.0)
TOKENS = 10
CONCURRENT = 4


def config(
    *, attempt: float = 1.0, deadline: float = 2.0, spill: Path | None = None, max_attempts: int = 3
) -> GuardConfig:
    """Short deadlines, quick retries, no breaker (a stall must reach the database, not the
    breaker), no batching."""
    return GuardConfig(
        timeout=TimeoutConfig(attempt=attempt, deadline=deadline, critical_deadline=deadline),
        retry=RetryConfig(
            max_attempts=max_attempts,
            critical_max_attempts=max_attempts,
            initial_backoff=0.01,
            max_backoff=0.05,
            jitter=0.01,
        ),
        breaker=BreakerConfig(enabled=False),
        batching=BatchConfig(enabled=False),
        dead_letter=DeadLetterConfig(
            path=None if spill is None else str(spill), replay_rate=100_000, drain_timeout=10
        ),
        logging=LoggingConfig(interval=60),
    )


def guarded(store: object, cfg: GuardConfig | None = None) -> Any:
    return guard(store, registry=CollectorRegistry(), config=cfg or config())


def payload(token: str) -> dict[str, Any]:
    return {"token": token, "trajectory": {"steps": [token]}}


def delivered(results: Iterable[object]) -> Counter[str]:
    """How many times each token's payload was returned (results that are not payloads: not)."""
    counts: Counter[str] = Counter()
    for result in results:
        if isinstance(result, dict):
            assert result == payload(result["token"])
            counts[result["token"]] += 1
    return counts


@contextlib.asynccontextmanager
async def stalled(dsn: str, schema: str) -> AsyncIterator[None]:
    """``planner_pauses`` locked by another connection for the duration of the block."""
    locker = await asyncpg.connect(dsn)
    try:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute(f'LOCK TABLE "{schema}".planner_pauses IN ACCESS EXCLUSIVE MODE')
        try:
            yield
        finally:
            await transaction.rollback()
    finally:
        await locker.close()


async def resume_concurrently(store: Any, tokens: Iterable[str], per_token: int = CONCURRENT) -> list[Any]:
    """``per_token`` concurrent resumes of every token, all at once."""
    return await asyncio.gather(
        *(store.load_planner_state(token) for token in tokens for _ in range(per_token))
    )


async def gave_up(resume: Awaitable[Any], seconds: float) -> object:
    """The caller's side: ``resume`` under ``asyncio.wait_for``; the caller's timeout is returned."""
    try:
        return await asyncio.wait_for(resume, seconds)
    except TimeoutError as exc:
        return exc


async def loadable(raw: asyncpg.Connection, schema: str) -> int:
    """Pauses anyone could still consume (unconsumed, not expired)."""
    count: int = await raw.fetchval(
        f'SELECT count(*) FROM "{schema}".planner_pauses WHERE consumed_at IS NULL AND expires_at > now()'
    )
    return count


class AnswerAfter(PostgresStateStore):
    """A backend whose consume commits, then answers ``answer_delay`` seconds later (a network
    that is slow on the way back): a caller that gives up in between loses the answer."""

    answer_delay = 0.0
    before_delay = 0.0
    lose_answer = False

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        if self.before_delay:
            await asyncio.sleep(self.before_delay)
        result = await super().load_planner_state(token)
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        if self.lose_answer:
            raise ConnectionResetError("the answer was lost")
        return result


async def answer_after(dsn: str, schema: str) -> AnswerAfter:
    return await AnswerAfter.connect(
        dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, pool=POOL, types=DEFAULT_TYPES
    )


# --- the backend: recovering a consume whose answer was lost ------------------------------------------


async def consume(
    store: PostgresStateStore, token: str, key: str | None, unanswered: tuple[str, ...] = ()
) -> Any:
    with idempotency_key(key), unanswered_keys(unanswered):
        return await store.load_planner_state(token)


@pytest.mark.asyncio
async def test_a_recovering_consume_moves_the_pause_to_its_own_key(store: PostgresStateStore) -> None:
    await store.save_planner_state("tok", payload("tok"))
    assert await consume(store, "tok", "lost") == payload("tok")  # its answer "never arrived"
    assert await consume(store, "tok", "other") is None
    assert await consume(store, "tok", "next", ("lost",)) == payload("tok")
    assert await consume(store, "tok", "late", ("lost",)) is None  # recovered once
    assert await consume(store, "tok", "lost") is None  # the old key no longer gets it
    assert await consume(store, "tok", "next") == payload("tok")  # a retry of the recovering call
    await store.save_planner_state("fresh", payload("fresh"))
    assert await consume(store, "fresh", "first", ("unknown",)) == payload("fresh")  # or a plain consume


@pytest.mark.asyncio
async def test_concurrent_recovering_consumes_exactly_one_wins(make_store: StoreFactory) -> None:
    stores = [await make_store() for _ in range(3)]  # separate pools: real concurrency
    for round_number in range(5):
        token = f"tok-{round_number}"
        await stores[0].save_planner_state(token, payload(token))
        assert await consume(stores[0], token, f"lost-{round_number}") == payload(token)
        results = await asyncio.gather(
            *(
                consume(stores[index % 3], token, f"next-{round_number}-{index}", (f"lost-{round_number}",))
                for index in range(9)
            )
        )
        assert delivered(results) == Counter({token: 1})


@pytest.mark.asyncio
async def test_recovery_ends_with_the_grace_period(make_store: StoreFactory) -> None:
    store = await make_store(consume_grace=0.3)
    await store.save_planner_state("tok", payload("tok"))
    assert await consume(store, "tok", "lost") == payload("tok")
    await asyncio.sleep(0.45)
    assert await consume(store, "tok", "next", ("lost",)) is None


# --- finding 1: a pause token handed out several times ---------------------------------------------


@pytest.mark.asyncio
async def test_resumes_that_timed_out_leave_each_pause_to_exactly_one_later_resume(
    make_store: StoreFactory, pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """Finding 1: planner_pauses locked for 6 s so 10 resumes time out (each returns ``None``);
    once the lock is gone and the statements left behind it have run (2 s later: the finding waited
    10 s, which proves nothing more), 4 concurrent resumes per token: exactly one of them gets each
    payload (before the fix: all 4, the timed-out resume's key being reused by every later resume)."""
    backend = await make_store(pool=POOL)
    store = guarded(backend)
    tokens = [f"pause-{index}" for index in range(TOKENS)]
    for token in tokens:
        await backend.save_planner_state(token, payload(token))

    loop = asyncio.get_running_loop()
    async with stalled(pg_dsn, schema_name):
        locked_at = loop.time()
        timed_out = await asyncio.gather(*(store.load_planner_state(token) for token in tokens))
        assert timed_out == [None] * TOKENS
        assert controller(store).stats()[("load_planner_state", "timeout")] == TOKENS
        await asyncio.sleep(max(0.0, locked_at + 6.0 - loop.time()))
    await asyncio.sleep(2.0)

    results = await resume_concurrently(store, tokens)
    assert delivered(results) == Counter({token: 1 for token in tokens})
    assert await loadable(raw, schema_name) == 0
    assert delivered(await resume_concurrently(store, tokens)) == Counter()  # and never again


@pytest.mark.asyncio
async def test_resumes_cancelled_by_their_caller_leave_each_pause_to_exactly_one_later_resume(
    make_store: StoreFactory, pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """A 3 s stall, callers that give up after 1 s (``asyncio.wait_for``): nobody got a payload;
    then concurrent resumes: each payload once."""
    backend = await make_store(pool=POOL)
    store = guarded(backend, config(attempt=2.5, deadline=2.5))
    tokens = [f"pause-{index}" for index in range(TOKENS)]
    for token in tokens:
        await backend.save_planner_state(token, payload(token))

    async with stalled(pg_dsn, schema_name):
        given_up = await asyncio.gather(*(gave_up(store.load_planner_state(token), 1.0) for token in tokens))
        assert all(isinstance(result, TimeoutError) for result in given_up)
        await asyncio.sleep(2.0)
    results = await resume_concurrently(store, tokens)
    assert delivered(results) == Counter({token: 1 for token in tokens})
    assert await loadable(raw, schema_name) == 0


@pytest.mark.asyncio
async def test_a_consume_committed_after_its_caller_gave_up_goes_to_exactly_one_later_resume(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """The database consumed the token but the answer arrives after the caller gave up: the payload
    is nobody's yet, and exactly one later resume gets it (none of the concurrent others)."""
    backend = await answer_after(pg_dsn, schema_name)
    try:
        store = guarded(backend, config(attempt=2.5, deadline=2.5))
        tokens = [f"pause-{index}" for index in range(TOKENS)]
        for token in tokens:
            await backend.save_planner_state(token, payload(token))
        backend.answer_delay = 3.0
        given_up = await asyncio.gather(*(gave_up(store.load_planner_state(token), 1.0) for token in tokens))
        assert all(isinstance(result, TimeoutError) for result in given_up)
        assert await loadable(raw, schema_name) == 0  # consumed in the database, answered to nobody

        backend.answer_delay = 0.0
        results = await resume_concurrently(store, tokens)
        assert delivered(results) == Counter({token: 1 for token in tokens})
        assert delivered(await resume_concurrently(store, tokens)) == Counter()
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_lost_answers_go_to_exactly_one_later_resume(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    """Every attempt of a resume consumed the token and lost its answer (``Fault.error_after``):
    the resume returned ``None``; concurrent later resumes: exactly one gets each payload."""
    backend = await make_store(pool=POOL)
    faulty = FaultyStore(
        backend, FaultPlan.always(Fault.error_after(ConnectionResetError), methods=["load_planner_state"])
    )
    store = guarded(faulty)
    tokens = [f"pause-{index}" for index in range(TOKENS)]
    for token in tokens:
        await backend.save_planner_state(token, payload(token))
    assert await asyncio.gather(*(store.load_planner_state(token) for token in tokens)) == [None] * TOKENS
    assert fault_injector(faulty).calls("load_planner_state") == 3 * TOKENS  # retried under one key each
    assert await loadable(raw, schema_name) == 0
    assert await backend.load_planner_state(tokens[0]) is None  # consumed for anyone outside the guard

    fault_injector(faulty).plan = FaultPlan()
    results = await resume_concurrently(store, tokens)
    assert delivered(results) == Counter({token: 1 for token in tokens})
    assert delivered(await resume_concurrently(store, tokens)) == Counter()


@pytest.mark.asyncio
async def test_a_lost_answer_is_given_again_to_the_same_call_only(make_store: StoreFactory) -> None:
    """A caller's own key (``idempotency_key``) marks one logical resume: a retry with it within
    ``consume_grace`` is answered again; a resume by anyone else never inherits it."""
    backend = await make_store(pool=POOL)
    faulty = FaultyStore(
        backend, FaultPlan.always(Fault.error_after(ConnectionResetError), methods=["load_planner_state"])
    )
    store = guarded(faulty)
    await backend.save_planner_state("tok", payload("tok"))
    with idempotency_key("request-1"):
        assert await store.load_planner_state("tok") is None  # consumed, every answer lost
    fault_injector(faulty).plan = FaultPlan()
    assert await resume_concurrently(store, ["tok"]) == [None] * CONCURRENT  # nobody else's
    with idempotency_key("request-2"):
        assert await store.load_planner_state("tok") is None
    with idempotency_key("request-1"):
        assert await store.load_planner_state("tok") == payload("tok")  # the retry of that call


@pytest.mark.asyncio
async def test_every_pause_is_delivered_exactly_once_through_timeouts_cancellations_and_lost_answers(
    pg_dsn: str, schema_name: str, raw: asyncpg.Connection
) -> None:
    """Rounds of concurrent resumes of every token, each resume meeting (seeded at random) a clean
    answer, a lost answer (every attempt), a caller giving up before or after the database
    consumed the token, or a stalled table; then clean rounds. Each payload exactly once."""
    backend = await answer_after(pg_dsn, schema_name)
    try:
        store = guarded(backend, config(attempt=0.6, deadline=1.2, max_attempts=2))
        tokens = [f"pause-{index}" for index in range(30)]
        for token in tokens:
            await backend.save_planner_state(token, payload(token))
        rng = random.Random(13)
        results: list[object] = []

        async def resume(token: str, fault: str) -> object:
            if fault == "cancel_after_commit":
                return await gave_up(store.load_planner_state(token), 0.15)
            if fault == "cancel_before":
                return await gave_up(store.load_planner_state(token), 0.05)
            return await store.load_planner_state(token)

        for round_number in range(4):
            fault = ["lost_answer", "cancel_after_commit", "cancel_before", "stall"][round_number]
            backend.lose_answer = fault == "lost_answer"
            backend.answer_delay = 0.5 if fault == "cancel_after_commit" else 0.0
            backend.before_delay = 0.3 if fault == "cancel_before" else 0.0
            # Each token: one resume meeting the round's fault, racing a clean resume half the time.
            faulted = [token for token in tokens if rng.random() < 0.7]
            clean = [token for token in tokens if rng.random() < 0.5]
            if fault == "stall":
                async with stalled(pg_dsn, schema_name):
                    results += await asyncio.gather(*(resume(token, fault) for token in faulted))
                results += await asyncio.gather(*(store.load_planner_state(token) for token in clean))
            else:
                results += await asyncio.gather(
                    *(resume(token, fault) for token in faulted),
                    *(store.load_planner_state(token) for token in clean),
                )
        backend.lose_answer = False
        backend.answer_delay = backend.before_delay = 0.0
        await asyncio.sleep(0.6)  # answers still on their way back arrive at nobody
        for _ in range(2):
            results += await resume_concurrently(store, tokens)
        assert delivered(results) == Counter({token: 1 for token in tokens})
        assert await loadable(raw, schema_name) == 0
    finally:
        await backend.close()


# --- finding 2: a held pause token lost when its resume is cancelled --------------------------------


async def held_pauses(tmp_path: Path, make_store: StoreFactory, tokens: list[str]) -> tuple[Any, Any]:
    """A guarded store whose pauses in ``tokens`` were saved while saves failed: each is held in the
    dead-letter buffer (and its spill file); saves keep failing, so nothing is replayed."""
    backend = await make_store(pool=POOL)
    faulty = FaultyStore(
        backend,
        FaultPlan.always(Fault.error_before(ConnectionRefusedError), methods=["save_planner_state"]),
    )
    store = guarded(faulty, config(attempt=2.5, deadline=2.5, spill=tmp_path / "dlq.sqlite"))
    for token in tokens:
        await store.save_planner_state(token, payload(token))
    assert controller(store).stats()[("save_planner_state", "dead_lettered")] == len(tokens)
    return store, faulty


async def still_held(store: Any, token: str) -> bool:
    buffer = controller(store).dead_letters
    assert buffer is not None
    return await buffer.latest_for_key("save_planner_state", token) is not None


@pytest.mark.asyncio
async def test_a_held_pause_whose_resume_is_cancelled_stays_for_the_next_resume(
    make_store: StoreFactory, pg_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    """Finding 2: a resume of a held pause that stalls in the database (3 s: delivering the held
    save to it first) and whose caller gives up after 1 s leaves the pause held; it is delivered
    later, once (before the fix: 10 of 10 lost)."""
    tokens = [f"held-{index}" for index in range(TOKENS)]
    store, faulty = await held_pauses(tmp_path, make_store, tokens)
    saves_fail = fault_injector(faulty).plan
    async with stalled(pg_dsn, schema_name):
        fault_injector(faulty).plan = FaultPlan()  # the saves reach the stalled database
        given_up = await asyncio.gather(*(gave_up(store.load_planner_state(token), 1.0) for token in tokens))
        assert all(isinstance(result, TimeoutError) for result in given_up)
        assert [await still_held(store, token) for token in tokens] == [True] * TOKENS
        fault_injector(faulty).plan = saves_fail
        await asyncio.sleep(2.0)

    # The database answers again but the held saves still fail: a save stalled above may have
    # landed (consumed now, once); else the database answers None and the hold waits for its
    # replay, which the next resumes get, once.
    results = await resume_concurrently(store, tokens)
    fault_injector(faulty).plan = FaultPlan()
    assert await controller(store).drain(timeout=10) == 0
    results += await resume_concurrently(store, tokens)
    assert delivered(results) == Counter({token: 1 for token in tokens})
    assert [await still_held(store, token) for token in tokens] == [False] * TOKENS
    assert delivered(await resume_concurrently(store, tokens)) == Counter()  # never again


@pytest.mark.asyncio
async def test_concurrent_resumes_of_a_held_pause_that_fail_or_give_up_deliver_it_once(
    make_store: StoreFactory, pg_dsn: str, schema_name: str, tmp_path: Path
) -> None:
    """Held pauses, resumed concurrently while the database stalls: some callers give up, the
    others get the held payload when their own consume times out -- one of them per token."""
    tokens = [f"held-{index}" for index in range(TOKENS)]
    store, _ = await held_pauses(tmp_path, make_store, tokens)
    async with stalled(pg_dsn, schema_name):
        giving_up = [asyncio.ensure_future(gave_up(store.load_planner_state(token), 1.0)) for token in tokens]
        await asyncio.sleep(0.2)  # the callers that give up reach the held pauses first
        results = await asyncio.gather(
            *giving_up, *(store.load_planner_state(token) for token in tokens for _ in range(2))
        )
    results += await resume_concurrently(store, tokens)
    assert delivered(results) == Counter({token: 1 for token in tokens})
