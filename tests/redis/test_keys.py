"""Keys: a caller's id is escaped, never interpreted: ``{``, ``}``, ``*`` or ``:`` in an id neither
moves a key to another slot nor matches another id's keys; every key the store writes has a TTL."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from redis import asyncio as redis_asyncio
from redis.crc import key_slot

from guarded.backends.redis import RedisStateStore, escape_id, unescape_id
from guarded.models import (
    PlannerEvent,
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)

NASTY = ["{a}", "a}", "{", "}", "*", "a:b", ":", "?[x]\\", "a b", "", "%7B", "\x00é🐧"]


def slot(key: str) -> int:
    return key_slot(key.encode("utf-8"))


def tag_of(key: str) -> str:
    """The hash tag Redis Cluster reads in ``key``: between the first ``{`` and the next ``}``."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start + 1)]


def test_escaping_is_reversible_and_never_yields_a_special_character() -> None:
    for value in NASTY:
        escaped = escape_id(value)
        assert unescape_id(escaped) == value
        assert not set(escaped) & set("{}*?[]\\: \t\r\n")
    assert len({escape_id(value) for value in NASTY}) == len(NASTY)


@pytest.mark.parametrize("value", NASTY)
def test_an_id_does_not_change_the_slot_of_its_keys(store: RedisStateStore, value: str) -> None:
    keys = store.keys
    assert {
        slot(key) for key in (*keys.events(value), *keys.planner_events(value), keys.trajectory(value))
    } == {slot("{" + keys.trace_tag(value) + "}")}
    session_keys = (
        keys.tasks_of(value),
        keys.traces_of(value),
        *keys.stream("updates", value),
        *keys.stream("steering", value),
        *keys.bindings_of(value),
    )
    assert {tag_of(key) for key in session_keys} == {keys.session_tag(value)}
    assert {slot(key) for key in session_keys} == {slot("{" + keys.session_tag(value) + "}")}
    memory = keys.memory("tenant:user:" + value)
    assert len({slot(key) for key in memory}) == 1
    assert tag_of(keys.pause(value)) == "p." + escape_id(value)


def update(session: str, update_id: str) -> StateUpdate:
    return StateUpdate(
        session_id=session,
        task_id="k",
        update_id=update_id,
        update_type=UpdateType.PROGRESS,
        content=update_id,
    )


@pytest.mark.asyncio
async def test_ids_with_special_characters_never_see_each_others_data(store: RedisStateStore) -> None:
    for value in NASTY:
        await store.save_update(update(value, f"u-{value}"))
        await store.save_planner_state(value, {"token": value})
        await store.save_memory_state(f"t:u:{value}", {"key": value})
        await store.save_event(StoredEvent(value or None, 1.0, "k", None, None, {"trace": value}))
    for value in NASTY:
        assert [item.content for item in await store.list_updates(value)] == [f"u-{value}"]
        assert await store.load_planner_state(value) == {"token": value}
        assert await store.load_memory_state(f"t:u:{value}") == {"key": value}
        if value:
            assert [event.payload for event in await store.load_history(value)] == [{"trace": value}]
    # list_memory_keys by suffix: "t:u:a:b" ends with ":b" and ":a:b", never ":a}" or ":*"
    assert await store.list_memory_keys("b") == ["t:u:a:b"]
    assert await store.list_memory_keys("a:b") == ["t:u:a:b"]
    assert await store.list_memory_keys("*") == ["t:u:*"]
    assert await store.list_memory_keys("{") == ["t:u:{"]


async def workload(store: RedisStateStore) -> None:
    """One call of every write (and the bulk forms) under the store's prefix."""
    now = datetime(2025, 1, 1, tzinfo=UTC)
    snapshot = TaskContextSnapshot(session_id="s", task_id="k")
    await store.save_event(StoredEvent("t", 1.0, "k", "n", "i", {"a": 1}))
    await store.save_events([StoredEvent("t2", 2.0, "k", None, None, {})])
    await store.save_remote_binding(RemoteBinding("t", "c", "k", "http://a", router_session_id="r"))
    await store.save_remote_bindings([RemoteBinding("t2", None, "k", "http://a", router_session_id="r")])
    await store.mark_binding_terminal(trace_id="t", context_id="c", task_id="k")
    await store.mark_bindings_terminal([("t2", None, "k")])
    await store.save_planner_state("p", {"x": 1})
    await store.save_planner_states([("p2", {"x": 2})])
    await store.load_planner_state("p")
    await store.load_planner_state("never-saved")
    await store.save_memory_state("a:b:s", {"m": 1})
    await store.save_memory_states([("a:c:s", {"m": 2})])
    task = TaskState("k", "s", TaskStatus.RUNNING, TaskType.BACKGROUND, 1, snapshot, updated_at=now)
    await store.save_task(task)
    await store.save_tasks(
        [TaskState("k", "s2", TaskStatus.RUNNING, TaskType.BACKGROUND, 1, snapshot, updated_at=now)]
    )
    await store.save_update(update("s", "u1"))
    await store.save_updates([update("s", "u2")])
    await store.save_steering(SteeringEvent(session_id="s", task_id="k", event_type=SteeringEventType.PAUSE))
    await store.save_trajectory("t", "s", {"steps": []})
    await store.save_trajectories([("t2", "s", {"steps": []})])
    await store.save_planner_event("t", PlannerEvent(event_type="step", ts=1.0, trajectory_step=0))
    await store.save_planner_events([("t2", PlannerEvent(event_type="step", ts=1.0, trajectory_step=0))])
    ref = await store.artifact_store.put_bytes(b"x", scope=None)
    await store.artifact_store.put_text("y")
    await store.artifact_store.get(ref.id)


@pytest.mark.asyncio
async def test_every_key_the_store_writes_has_a_ttl(
    store: RedisStateStore, raw_redis: redis_asyncio.Redis
) -> None:
    await workload(store)
    keys = [key async for key in raw_redis.scan_iter(match=store.keys.everything(), count=1000)]
    assert len(keys) > 25
    ttls = {key.decode(): await raw_redis.pttl(key) for key in keys}
    assert {key: ttl for key, ttl in ttls.items() if ttl < 0} == {}
    # ... and each key one tag, that of its call
    assert all(key.count("{") == 1 and key.count("}") == 1 for key in ttls)


def test_every_class_of_key_has_a_bounded_ttl() -> None:
    from guarded.backends.redis import RedisSettings
    from guarded.backends.redis.redis_options import check_settings

    for name in ("pause_ttl", "memory_ttl", "session_ttl", "trace_ttl", "artifact_ttl"):
        for bad in (0, None, -1, float("inf")):
            with pytest.raises(ValueError, match=name):
                check_settings(RedisSettings(**{name: bad}))  # type: ignore[arg-type]


def test_slots_of_distinct_ids_are_independent() -> None:
    """Escaped distinct ids give distinct tags (no two ids share one key)."""
    tags = {escape_id(a + b) for a, b in itertools.product(NASTY, repeat=2)}
    assert len(tags) == len({a + b for a, b in itertools.product(NASTY, repeat=2)})


@pytest.mark.asyncio
async def test_settings_set_on_a_store_give_the_ttls_of_its_next_writes(
    store: RedisStateStore, raw_redis: redis_asyncio.Redis
) -> None:
    from dataclasses import replace

    store.settings = replace(store.settings, memory_ttl=50.0)
    await store.save_memory_state("k", {"v": 1})
    record, index = store.keys.memory("k")
    for key in (record, index):
        assert 0 < await raw_redis.pttl(key) <= 50_000
