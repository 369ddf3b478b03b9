"""Last-write-wins on Redis, enforced in the server's scripts: a direct write is applied with
``max(its time, the stored time + 1)``, a replay only when not older (else
``WriteSupersededError``), every stored time merged into the process clock (tasks by
``updated_at``, on every durable store: tests/durable/test_durable_last_write_wins.py)."""

from __future__ import annotations

import pytest
from redis import asyncio as redis_asyncio

from guarded.backend import next_logical_time
from guarded.backends.redis import RedisStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.models import RemoteBinding


@pytest.mark.asyncio
async def test_a_direct_memory_write_is_applied_over_a_newer_time(
    store: RedisStateStore, raw_redis: redis_asyncio.Redis
) -> None:
    later = next_logical_time() + 60_000_000  # another host's clock, a minute ahead
    with logical_times((later,)):
        await store.save_memory_state("t:u:s", {"v": "ahead"})
    earlier = later - 120_000_000
    with logical_times((earlier,)):
        await store.save_memory_state("t:u:s", {"v": "behind"})  # direct: applied all the same
    assert await store.load_memory_state("t:u:s") == {"v": "behind"}
    record, _ = store.keys.memory("t:u:s")
    assert int(await raw_redis.hget(record, "lt") or 0) == later + 1  # its time only grows
    assert next_logical_time() > later + 1  # the process clock moved past what it saw


@pytest.mark.asyncio
async def test_a_replay_older_than_the_stored_write_is_refused_and_reported(store: RedisStateStore) -> None:
    held = next_logical_time()
    await store.save_memory_state("t:u:s", {"v": "newer"})
    await store.save_trajectory("trace", "s", {"steps": ["newer"]})
    await store.save_remote_binding(RemoteBinding("trace", None, "k", "http://a", router_session_id="r"))
    await store.mark_binding_terminal(trace_id="trace", context_id=None, task_id="k")
    with logical_times((held,)), replaying():
        with pytest.raises(WriteSupersededError):
            await store.save_memory_state("t:u:s", {"v": "older"})
        with pytest.raises(WriteSupersededError):
            await store.save_trajectory("trace", "s", {"steps": ["older"]})
        with pytest.raises(WriteSupersededError):
            await store.save_remote_binding(
                RemoteBinding("trace", None, "k", "http://b", router_session_id="r")
            )
        with pytest.raises(WriteSupersededError):
            await store.mark_binding_terminal(trace_id="trace", context_id=None, task_id="k")
    assert await store.load_memory_state("t:u:s") == {"v": "newer"}
    assert await store.get_trajectory("trace", "s") == {"steps": ["newer"]}
    [binding] = await store.list_bindings(router_session_id="r")
    assert (binding.agent_url, binding.is_terminal) == ("http://a", True)


@pytest.mark.asyncio
async def test_a_replay_not_older_replaces_and_a_bulk_reports_each_refusal(store: RedisStateStore) -> None:
    first = next_logical_time()
    with logical_times((first,)):
        await store.save_memory_state("t:u:s", {"v": 1})
    with logical_times((first,)), replaying():
        await store.save_memory_state("t:u:s", {"v": "same time"})  # an equal time wins
    assert await store.load_memory_state("t:u:s") == {"v": "same time"}
    newer = next_logical_time()
    with (
        logical_times((first - 1, newer, first - 2)),
        replaying(),
        pytest.raises(WriteSupersededError) as caught,
    ):
        await store.save_memory_states([("t:u:s", {"v": "a"}), ("x:y:s", {"v": "b"}), ("t:u:s", {"v": "c"})])
    assert caught.value.refused == 2
    assert await store.load_memory_state("t:u:s") == {"v": "same time"}
    assert await store.load_memory_state("x:y:s") == {"v": "b"}
    assert await store.list_memory_keys("s") == ["t:u:s", "x:y:s"]
