"""The reference InMemoryStateStore: every method, PenguiFlow 3.11 semantics, strict storage."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from guarded.backend import next_logical_time
from guarded.backends.memory import DROP_KINDS, InMemoryStateStore
from guarded.backends.memory_artifacts import InMemoryArtifactStore
from guarded.codec import (
    PLANNER_EVENT,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    RecordCodec,
    penguiflow_types,
    register_trajectory_type,
)
from guarded.errors import InvalidPayloadError, WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.models import (
    GLOBAL_TRACE_ID,
    ArtifactRetentionConfig,
    ArtifactStore,
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
from guarded.protocol import CAPABILITIES, LEGACY_ALIASES, StateStore, capabilities


def stored(
    ts: float = 1.0, kind: str = "node_start", trace_id: str | None = "t1", **payload: Any
) -> StoredEvent:
    return StoredEvent(trace_id, ts, kind, "node", "node-1", payload)


def task(task_id: str = "task1", session_id: str = "s1", **changes: Any) -> TaskState:
    snapshot = TaskContextSnapshot(session_id=session_id, task_id=task_id, llm_context={"k": [1]})
    state = TaskState(task_id, session_id, TaskStatus.RUNNING, TaskType.BACKGROUND, 1, snapshot)
    return dataclasses.replace(state, **changes)


def update(update_id: str, task_id: str = "task1", session_id: str = "s1", content: Any = "x") -> StateUpdate:
    return StateUpdate(
        session_id=session_id,
        task_id=task_id,
        update_id=update_id,
        update_type=UpdateType.PROGRESS,
        content=content,
    )


def steering(
    event_id: str,
    task_id: str = "task1",
    session_id: str = "s1",
    event_type: SteeringEventType = SteeringEventType.USER_MESSAGE,
    **payload: Any,
) -> SteeringEvent:
    return SteeringEvent(
        session_id=session_id,
        task_id=task_id,
        event_id=event_id,
        event_type=event_type,
        payload=payload or {"text": f"message {event_id}"},
    )


def binding(
    task_id: str = "rt1",
    *,
    trace_id: str = "t1",
    context_id: str | None = "c1",
    router_session_id: str | None = "rs",
    agent_url: str = "http://agent",
    **changes: Any,
) -> RemoteBinding:
    return RemoteBinding(
        trace_id,
        context_id,
        task_id,
        agent_url,
        router_session_id=router_session_id,
        remote_skill="skill",
        **changes,
    )


def planner_event(index: int, **extra: Any) -> PlannerEvent:
    return PlannerEvent("step_complete", 100.0, trajectory_step=index, extra=extra)


@pytest.fixture
def store() -> InMemoryStateStore:
    return InMemoryStateStore()


def test_offers_every_capability_and_legacy_alias(store: InMemoryStateStore) -> None:
    report = capabilities(store)
    assert report.offered == [capability.name for capability in CAPABILITIES]
    assert set(report.legacy_aliases) == set(LEGACY_ALIASES)
    assert isinstance(store, StateStore)


def test_artifact_store_property(store: InMemoryStateStore) -> None:
    assert isinstance(store.artifact_store, InMemoryArtifactStore)
    assert isinstance(store.artifact_store, ArtifactStore)
    assert store.artifact_store is store.artifact_store
    retention = ArtifactRetentionConfig(ttl_seconds=5, cleanup_strategy="fifo")
    assert InMemoryStateStore(artifact_retention=retention).artifact_store.retention == retention


class TestAuditLog:
    @pytest.mark.asyncio
    async def test_save_event_is_idempotent(self, store: InMemoryStateStore) -> None:
        await store.save_event(stored(1.0, a=1))
        await store.save_event(stored(1.0, a=1))
        await store.save_event(stored(1, a=1))
        await store.save_event(stored(1.0, a=2))
        assert [event.payload for event in await store.load_history("t1")] == [{"a": 1}, {"a": 2}]

    @pytest.mark.asyncio
    async def test_events_of_other_traces_are_distinct(self, store: InMemoryStateStore) -> None:
        await store.save_event(stored(trace_id="t1"))
        await store.save_event(stored(trace_id="t2"))
        assert len(await store.load_history("t1")) == len(await store.load_history("t2")) == 1

    @pytest.mark.parametrize("trace_id", [None, "", GLOBAL_TRACE_ID])
    @pytest.mark.asyncio
    async def test_global_events_are_stored_under_the_sentinel(
        self, store: InMemoryStateStore, trace_id: str | None
    ) -> None:
        await store.save_event(stored(trace_id=trace_id))
        await store.save_event(stored(trace_id=None))
        history = await store.load_history(GLOBAL_TRACE_ID)
        assert [event.trace_id for event in history] == [GLOBAL_TRACE_ID]

    @pytest.mark.asyncio
    async def test_history_is_ascending_by_ts_and_insertion_for_ties(self, store: InMemoryStateStore) -> None:
        for ts, name in [(3.0, "c"), (1.0, "a1"), (2.0, "b"), (1.0, "a2"), (1.0, "a3")]:
            await store.save_event(stored(ts, n=name))
        assert [event.payload["n"] for event in await store.load_history("t1")] == [
            "a1",
            "a2",
            "a3",
            "b",
            "c",
        ]

    @pytest.mark.asyncio
    async def test_unknown_trace_is_empty(self, store: InMemoryStateStore) -> None:
        assert await store.load_history("nope") == []

    @pytest.mark.asyncio
    async def test_unknown_kinds_are_accepted(self, store: InMemoryStateStore) -> None:
        await store.save_event(stored(kind="vendor.custom/event-42"))
        assert (await store.load_history("t1"))[0].kind == "vendor.custom/event-42"

    @pytest.mark.asyncio
    async def test_round_trip_is_lossless(self, store: InMemoryStateStore) -> None:
        event = StoredEvent(
            "t1", 1702857600.123, "node_error", None, None, {"flow_error": {"code": "X"}, "n": None}
        )
        await store.save_event(event)
        assert await store.load_history("t1") == [event]

    @pytest.mark.asyncio
    async def test_save_events_bulk_has_the_same_idempotency(self, store: InMemoryStateStore) -> None:
        await store.save_event(stored(1.0, a=1))
        await store.save_events([stored(1.0, a=1), stored(2.0, a=2), stored(2.0, a=2), stored(trace_id=None)])
        assert len(await store.load_history("t1")) == 2
        assert len(await store.load_history(GLOBAL_TRACE_ID)) == 1

    @pytest.mark.asyncio
    async def test_save_events_stores_nothing_when_one_is_invalid(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_events([stored(1.0), stored(2.0, bad=float("nan"))])
        assert caught.value.method == "save_events"
        assert caught.value.path == "events[1].payload[key #0 (str)]"
        assert await store.load_history("t1") == []


class TestStrictStorage:
    @pytest.mark.parametrize(
        ("payload", "path"),
        [
            ({"x": float("nan")}, "event.payload[key #0 (str)]"),
            ({"x": float("inf")}, "event.payload[key #0 (str)]"),
            ({"x": ["ok", "lone \ud800"]}, "event.payload[key #0 (str)][1]"),
            ({"ok": 0, "k\udc00": 1}, "event.payload[key #1 (str)]"),
            ({"x": object()}, "event.payload[key #0 (str)]"),
            ({"x": {1, 2}}, "event.payload[key #0 (str)]"),
            ({1: "non-string key"}, "event.payload[key #0 (int)]"),
        ],
    )
    @pytest.mark.asyncio
    async def test_events_json_cannot_carry_are_refused(
        self, store: InMemoryStateStore, payload: dict[Any, Any], path: str
    ) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_event(StoredEvent("t1", 1.0, "k", None, None, payload))
        assert (caught.value.method, caught.value.path) == ("save_event", path)
        assert await store.load_history("t1") == []

    @pytest.mark.asyncio
    async def test_a_nan_timestamp_is_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError, match=r"event\.ts"):
            await store.save_event(stored(float("nan")))

    @pytest.mark.asyncio
    async def test_a_task_without_id_is_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_task(dataclasses.replace(task(), task_id=None))  # type: ignore[arg-type]
        assert (caught.value.method, caught.value.path) == ("save_task", "state.task_id")
        assert await store.list_tasks("s1") == []

    @pytest.mark.asyncio
    async def test_a_task_with_a_non_json_result_is_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError, match=r"state\.result"):
            await store.save_task(task(result=object()))
        assert await store.list_tasks("s1") == []

    @pytest.mark.asyncio
    async def test_an_update_without_task_id_is_refused(self, store: InMemoryStateStore) -> None:
        bad = StateUpdate.model_construct(
            session_id="s1",
            task_id=None,  # type: ignore[arg-type]
            update_id="u1",
            update_type=UpdateType.PROGRESS,
            content="x",
        )
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_update(bad)
        assert caught.value.path == "update.task_id"
        assert await store.list_updates("s1") == []

    @pytest.mark.asyncio
    async def test_an_update_with_nan_content_is_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError, match=r"update\.content"):
            await store.save_update(update("u1", content={"v": float("nan")}))
        assert await store.list_updates("s1") == []

    @pytest.mark.asyncio
    async def test_planner_and_memory_state_must_be_json(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_planner_state("tok", {"trajectory": {"when": datetime.now(UTC)}})
        assert (caught.value.method, caught.value.path) == (
            "save_planner_state",
            "payload[key #0 (str)][key #0 (str)]",
        )
        with pytest.raises(InvalidPayloadError, match=r"save_memory_state: state\[key #0 \(str\)\]"):
            await store.save_memory_state("k", {"s": "\ud800"})
        assert await store.load_planner_state("tok") is None
        assert await store.load_memory_state("k") is None

    @pytest.mark.asyncio
    async def test_bad_planner_event_and_binding_are_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError, match=r"event\.extra"):
            await store.save_planner_event("t1", planner_event(1, blob=b"bytes"))
        with pytest.raises(InvalidPayloadError, match=r"binding\.metadata"):
            await store.save_remote_binding(binding(metadata={"x": float("nan")}))
        assert await store.list_planner_events("t1") == []
        assert await store.list_bindings(router_session_id="rs") == []

    @pytest.mark.asyncio
    async def test_a_non_json_trajectory_is_refused(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_trajectory("tr", "s1", {"steps": [float("nan")]})
        assert caught.value.method == "save_trajectory"
        assert await store.list_traces("s1") == []


class TestMutationIsolation:
    @pytest.mark.asyncio
    async def test_mutating_a_saved_event_does_not_change_history(self, store: InMemoryStateStore) -> None:
        payload: dict[str, Any] = {"nested": {"list": [1]}}
        await store.save_event(StoredEvent("t1", 1.0, "k", None, None, payload))
        payload["nested"]["list"].append(2)
        payload["new"] = True
        loaded = (await store.load_history("t1"))[0]
        assert loaded.payload == {"nested": {"list": [1]}}
        loaded.payload["nested"]["list"].append(3)
        assert (await store.load_history("t1"))[0].payload == {"nested": {"list": [1]}}

    @pytest.mark.asyncio
    async def test_planner_and_memory_state_are_copied(self, store: InMemoryStateStore) -> None:
        state: dict[str, Any] = {"turns": [{"user": "hi"}]}
        await store.save_memory_state("k", state)
        await store.save_planner_state("tok", state)
        state["turns"][0]["user"] = "changed"
        loaded = await store.load_memory_state("k")
        assert loaded == {"turns": [{"user": "hi"}]}
        loaded["turns"].append("more")
        assert await store.load_memory_state("k") == {"turns": [{"user": "hi"}]}
        assert await store.load_planner_state("tok") == {"turns": [{"user": "hi"}]}

    @pytest.mark.asyncio
    async def test_tasks_updates_and_trajectories_are_copied(self, store: InMemoryStateStore) -> None:
        state = task()
        content: dict[str, Any] = {"rows": [1]}
        trajectory: dict[str, Any] = {"steps": [{"a": 1}]}
        await store.save_task(state)
        await store.save_update(update("u1", content=content))
        await store.save_trajectory("tr", "s1", trajectory)
        state.context_snapshot.llm_context["k"].append(2)
        state.status = TaskStatus.FAILED
        content["rows"].append(2)
        trajectory["steps"].append({"b": 2})
        [loaded] = await store.list_tasks("s1")
        assert loaded.status == TaskStatus.RUNNING
        assert loaded.context_snapshot.llm_context == {"k": [1]}
        assert (await store.list_updates("s1"))[0].content == {"rows": [1]}
        assert await store.get_trajectory("tr", "s1") == {"steps": [{"a": 1}]}

    @pytest.mark.asyncio
    async def test_bindings_are_copied(self, store: InMemoryStateStore) -> None:
        metadata: dict[str, Any] = {"tags": ["a"]}
        await store.save_remote_binding(binding(metadata=metadata))
        metadata["tags"].append("b")
        found = await store.find_binding(
            router_session_id="rs", agent_url="http://agent", remote_skill="skill"
        )
        assert found is not None
        assert found.metadata == {"tags": ["a"]}


class TestBindings:
    @pytest.mark.asyncio
    async def test_upsert_by_trace_context_and_task(self, store: InMemoryStateStore) -> None:
        await store.save_remote_binding(binding(agent_url="http://old"))
        await store.save_remote_binding(binding(agent_url="http://new"))
        await store.save_remote_binding(binding(context_id=None))
        bindings = await store.list_bindings(router_session_id="rs")
        assert [(b.context_id, b.agent_url) for b in bindings] == [
            ("c1", "http://new"),
            (None, "http://agent"),
        ]

    @pytest.mark.asyncio
    async def test_find_returns_the_most_recently_saved_non_terminal_binding(
        self, store: InMemoryStateStore
    ) -> None:
        await store.save_remote_binding(binding("first"))
        await store.save_remote_binding(binding("second"))
        find = {"router_session_id": "rs", "agent_url": "http://agent", "remote_skill": "skill"}
        assert (await store.find_binding(**find)).task_id == "second"  # type: ignore[union-attr]
        await store.save_remote_binding(binding("first", last_remote_task_id="r2"))
        assert (await store.find_binding(**find)).task_id == "first"  # type: ignore[union-attr]
        await store.mark_binding_terminal(trace_id="t1", context_id="c1", task_id="first")
        assert (await store.find_binding(**find)).task_id == "second"  # type: ignore[union-attr]
        await store.save_remote_binding(binding("second", is_terminal=True))
        assert await store.find_binding(**find) is None

    @pytest.mark.asyncio
    async def test_find_matches_every_coordinate(self, store: InMemoryStateStore) -> None:
        await store.save_remote_binding(binding())
        for wrong in (
            {"router_session_id": "other"},
            {"agent_url": "http://elsewhere"},
            {"remote_skill": "other-skill"},
        ):
            query = {"router_session_id": "rs", "agent_url": "http://agent", "remote_skill": "skill", **wrong}
            assert await store.find_binding(**query) is None

    @pytest.mark.asyncio
    async def test_tenant_and_user_must_match_exactly(self, store: InMemoryStateStore) -> None:
        await store.save_remote_binding(binding("scoped", tenant_id="acme", user_id="u1"))
        await store.save_remote_binding(binding("unscoped", trace_id="t2"))
        find = {"router_session_id": "rs", "agent_url": "http://agent", "remote_skill": "skill"}
        assert (await store.find_binding(**find)).task_id == "unscoped"  # type: ignore[union-attr]
        scoped = await store.find_binding(**find, tenant_id="acme", user_id="u1")
        assert scoped is not None
        assert scoped.task_id == "scoped"
        assert await store.find_binding(**find, tenant_id="acme") is None
        assert await store.find_binding(**find, tenant_id="other", user_id="u1") is None

    @pytest.mark.asyncio
    async def test_mark_terminal(self, store: InMemoryStateStore) -> None:
        await store.save_remote_binding(binding())
        await store.mark_binding_terminal(trace_id="t1", context_id="c1", task_id="rt1")
        await store.mark_binding_terminal(trace_id="t1", context_id="c1", task_id="unknown")
        [listed] = await store.list_bindings(router_session_id="rs")
        assert listed.is_terminal
        assert listed.agent_url == "http://agent"
        assert await store.list_bindings(router_session_id="other") == []


class TestPlannerState:
    @pytest.mark.asyncio
    async def test_load_consumes_once(self, store: InMemoryStateStore) -> None:
        payload = {"trajectory": {"steps": []}, "reason": "await_input", "payload": {"k": (1, 2)}}
        await store.save_planner_state("tok", payload)
        assert await store.load_planner_state("tok") == {**payload, "payload": {"k": [1, 2]}}
        assert await store.load_planner_state("tok") is None

    @pytest.mark.asyncio
    async def test_missing_token_is_none_never_empty(self, store: InMemoryStateStore) -> None:
        assert await store.load_planner_state("missing") is None
        await store.save_planner_state("empty", {})
        assert await store.load_planner_state("empty") == {}

    @pytest.mark.asyncio
    async def test_save_is_an_upsert(self, store: InMemoryStateStore) -> None:
        await store.save_planner_state("tok", {"v": 1})
        await store.save_planner_state("tok", {"v": 2})
        assert await store.load_planner_state("tok") == {"v": 2}

    @pytest.mark.asyncio
    async def test_optional_ttl(self) -> None:
        now = [1000.0]
        store = InMemoryStateStore(planner_state_ttl_seconds=60, clock=lambda: now[0])
        await store.save_planner_state("old", {"v": 1})
        await store.save_planner_state("fresh", {"v": 2})
        now[0] += 59
        await store.save_planner_state("fresh", {"v": 3})
        now[0] += 2
        assert await store.load_planner_state("old") is None
        assert await store.load_planner_state("fresh") == {"v": 3}

    @pytest.mark.asyncio
    async def test_a_consume_leaves_a_tombstone_only_a_newer_save_replaces(self) -> None:
        now = [1000.0]
        store = InMemoryStateStore(planner_state_ttl_seconds=60, clock=lambda: now[0])
        saved_at = next_logical_time()
        with logical_times((saved_at,)):
            await store.save_planner_state("tok", {"v": 1})
        assert await store.load_planner_state("tok") == {"v": 1}
        with (
            logical_times((saved_at,)),
            replaying(),
            pytest.raises(WriteSupersededError),
        ):  # a replay of the consumed save
            await store.save_planner_state("tok", {"v": 1})
        with (
            logical_times((saved_at + 1,)),
            replaying(),
            pytest.raises(WriteSupersededError),
        ):  # a save called before the consume, replayed
            await store.save_planner_states([("tok", {"v": 0})])
        assert await store.load_planner_state("tok") is None
        await store.save_planner_state("tok", {"v": 2})  # called after the consume: paused again
        assert await store.load_planner_state("tok") == {"v": 2}
        assert await store.load_planner_state("tok") is None
        now[0] += 61  # the tombstone is forgotten the TTL after the consume ...
        with logical_times((saved_at - 61_000_000,)), replaying():  # ... and a replay that old stores nothing
            await store.save_planner_state("tok", {"v": 1})
        assert store._pauses.consumed == {}
        assert await store.load_planner_state("tok") is None

    @pytest.mark.asyncio
    async def test_a_replayed_save_lives_for_the_ttl_after_its_call(self) -> None:
        store = InMemoryStateStore(planner_state_ttl_seconds=60)
        with logical_times((next_logical_time() - 61_000_000,)), replaying():
            await store.save_planner_state("expired", {"v": 1})
        with logical_times((next_logical_time() - 50_000_000,)), replaying():
            await store.save_planner_state("alive", {"v": 1})
        assert "expired" not in store._planner_state
        until, _ = store._planner_state["alive"]
        assert until is not None
        assert until - time.time() == pytest.approx(10, abs=1)

    @pytest.mark.asyncio
    async def test_an_untimed_replay_lives_its_whole_ttl_from_the_replay(self) -> None:
        """Held by a version that kept no logical time: its call time is unknown, so it lives the
        whole TTL from the replay (not a TTL counted from time 0, long expired)."""
        store = InMemoryStateStore(planner_state_ttl_seconds=60)
        with replaying():
            await store.save_planner_state("untimed", {"v": 1})
        assert "untimed" in store._planner_state
        until, _ = store._planner_state["untimed"]
        assert until is not None
        assert until - time.time() == pytest.approx(60, abs=1)
        assert await store.load_planner_state("untimed") == {"v": 1}

    @pytest.mark.asyncio
    async def test_a_held_consume_leaves_a_tombstone_and_spares_a_newer_save(self) -> None:
        store = InMemoryStateStore()
        held = (next_logical_time(),)
        with logical_times(held), replaying():  # the replay of a consume held for a save never delivered
            assert await store.load_planner_state("never") is None
            with pytest.raises(WriteSupersededError):
                await store.save_planner_state("never", {"v": 1})  # that save's replay
        assert await store.load_planner_state("never") is None
        with logical_times(held):
            await store.save_planner_state("newer", {"v": 1})
        await store.save_planner_state("newer", {"v": 2})
        with logical_times(held):
            assert await store.load_planner_state("newer") is None
        assert await store.load_planner_state("newer") == {"v": 2}

    @pytest.mark.asyncio
    async def test_concurrent_loads_consume_exactly_once(self, store: InMemoryStateStore) -> None:
        await store.save_planner_state("tok", {"v": 1})
        results = await asyncio.gather(*(store.load_planner_state("tok") for _ in range(20)))
        assert results.count({"v": 1}) == 1
        assert results.count(None) == 19


class TestMemoryState:
    @pytest.mark.asyncio
    async def test_upsert_and_repeatable_reads(self, store: InMemoryStateStore) -> None:
        assert await store.load_memory_state("t:u:s") is None
        await store.save_memory_state("t:u:s", {"version": 1, "health": "healthy"})
        await store.save_memory_state("t:u:s", {"version": 1, "health": "degraded"})
        assert await store.load_memory_state("t:u:s") == {"version": 1, "health": "degraded"}
        assert await store.load_memory_state("t:u:s") == {"version": 1, "health": "degraded"}


class TestTasks:
    @pytest.mark.asyncio
    async def test_upsert_by_task_id(self, store: InMemoryStateStore) -> None:
        await store.save_task(task("a"))
        await store.save_task(task("b"))
        await store.save_task(task("a", status=TaskStatus.COMPLETE, result={"answer": 42}))
        tasks = await store.list_tasks("s1")
        assert [(t.task_id, t.status, t.result) for t in tasks] == [
            ("a", TaskStatus.COMPLETE, {"answer": 42}),
            ("b", TaskStatus.RUNNING, None),
        ]
        assert await store.list_tasks("other") == []

    @pytest.mark.asyncio
    async def test_round_trip_keeps_every_field(self, store: InMemoryStateStore) -> None:
        state = task(
            trace_id="tr", error="boom", description="d", progress={"pct": 0.5}, result=[1, "two", None]
        )
        state.context_snapshot.context_version = 3
        state.context_snapshot.context_hash = "abc"
        await store.save_task(state)
        assert await store.list_tasks("s1") == [state]

    @pytest.mark.asyncio
    async def test_a_task_saved_under_another_session_moves(self, store: InMemoryStateStore) -> None:
        await store.save_task(task("a", session_id="s1"))
        await store.save_task(task("a", session_id="s2"))
        assert await store.list_tasks("s1") == []
        assert [t.session_id for t in await store.list_tasks("s2")] == ["s2"]


class TestUpdates:
    @pytest.mark.asyncio
    async def test_repeated_update_id_is_not_appended_twice(self, store: InMemoryStateStore) -> None:
        await store.save_update(update("u1", content="first"))
        await store.save_update(update("u1", content="retry"))
        await store.save_task_update(update("u1"))
        assert [u.content for u in await store.list_updates("s1")] == ["first"]

    @pytest.mark.asyncio
    async def test_cursor_filter_and_limit(self, store: InMemoryStateStore) -> None:
        for index in range(6):
            await store.save_update(update(f"u{index}", task_id="A" if index % 2 == 0 else "B"))

        async def page(**kwargs: Any) -> list[str]:
            return [u.update_id for u in await store.list_updates("s1", **kwargs)]

        assert await page() == ["u0", "u1", "u2", "u3", "u4", "u5"]
        assert await page(since_id="u2") == ["u3", "u4", "u5"]
        assert await page(since_id="u5") == []
        assert await page(since_id="unknown") == ["u0", "u1", "u2", "u3", "u4", "u5"]
        assert await page(since_id="") == ["u0", "u1", "u2", "u3", "u4", "u5"]
        assert await page(task_id="A") == ["u0", "u2", "u4"]
        assert await page(task_id="A", since_id="u1") == ["u2", "u4"]
        assert await page(limit=2) == ["u4", "u5"]
        assert await page(task_id="B", since_id="u0", limit=2) == ["u3", "u5"]
        # PenguiFlow's [-limit:]: 0 keeps all, -n all but the oldest n
        assert await page(limit=0) == ["u0", "u1", "u2", "u3", "u4", "u5"]
        assert await page(limit=-1) == ["u1", "u2", "u3", "u4", "u5"]
        assert await store.list_updates("unknown") == []

    @pytest.mark.asyncio
    async def test_legacy_aliases(self, store: InMemoryStateStore) -> None:
        await store.save_task_update(update("u1"))
        await store.save_update(update("u2"))
        listed = await store.list_task_updates("s1", since_id="u1")
        assert [u.update_id for u in listed] == ["u2"]

    @pytest.mark.asyncio
    async def test_updates_of_other_sessions_are_separate(self, store: InMemoryStateStore) -> None:
        await store.save_update(update("u1", session_id="s1"))
        await store.save_update(update("u1", session_id="s2"))
        assert len(await store.list_updates("s1")) == len(await store.list_updates("s2")) == 1


class TestSteering:
    @pytest.mark.asyncio
    async def test_the_sanitized_form_is_persisted(self, store: InMemoryStateStore) -> None:
        event = steering("e1", text="x" * 5000, score=float("nan"), name="bad \ud800")
        await store.save_steering(event)
        [saved] = await store.list_steering("s1")
        assert saved.payload == {"text": "x" * 4096, "score": "nan", "name": "bad \ufffd"}
        assert saved.event_id == "e1"
        assert saved.created_at == event.created_at
        assert len(event.payload["text"]) == 5000

    @pytest.mark.asyncio
    async def test_events_are_stored_sanitized_and_not_validated_as_penguiflows_reference(
        self, store: InMemoryStateStore
    ) -> None:
        # PenguiFlow validates in its sessions; its reference store keeps whatever it is given.
        await store.save_steering(steering("e1", event_type=SteeringEventType.PRIORITIZE, priority="high"))
        await store.save_steering(steering("e2", event_type=SteeringEventType.PRIORITIZE, priority=True))
        await store.save_steering(steering("e3", items=[1, 2]))
        saved = await store.list_steering("s1")
        assert [event.payload for event in saved] == [
            {"priority": "high"},
            {"priority": True},
            {"items": [1, 2]},
        ]

    @pytest.mark.asyncio
    async def test_bad_identifiers_are_invalid_payloads(self, store: InMemoryStateStore) -> None:
        with pytest.raises(InvalidPayloadError) as caught:
            await store.save_steering(steering("e\ud800"))
        assert (caught.value.method, caught.value.path) == ("save_steering", "event.event_id")

    @pytest.mark.asyncio
    async def test_idempotent_by_event_id(self, store: InMemoryStateStore) -> None:
        await store.save_steering(steering("e1", text="first"))
        await store.save_steering(steering("e1", text="retry"))
        assert [e.payload["text"] for e in await store.list_steering("s1")] == ["first"]

    @pytest.mark.asyncio
    async def test_cursor_filter_and_limit(self, store: InMemoryStateStore) -> None:
        for index in range(5):
            await store.save_steering(steering(f"e{index}", task_id="A" if index < 3 else "B"))

        async def page(**kwargs: Any) -> list[str]:
            return [e.event_id for e in await store.list_steering("s1", **kwargs)]

        assert await page(since_id="e1") == ["e2", "e3", "e4"]
        assert await page(since_id="e3", task_id="A") == []
        assert await page(since_id="missing", task_id="B") == ["e3", "e4"]
        assert await page(limit=1) == ["e4"]
        assert await page(task_id="A", limit=2) == ["e1", "e2"]


class Recorder:
    """A trajectory object with the serialise/from_serialised protocol."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def serialise(self) -> dict[str, Any]:
        return {"steps": list(self.steps)}

    @classmethod
    def from_serialised(cls, payload: Mapping[str, Any]) -> Recorder:
        return cls(list(payload["steps"]))


class TestTrajectories:
    @pytest.mark.asyncio
    async def test_get_checks_the_session(self, store: InMemoryStateStore) -> None:
        await store.save_trajectory("tr1", "s1", {"query": "q"})
        assert await store.get_trajectory("tr1", "s1") == {"query": "q"}
        assert await store.get_trajectory("tr1", "s2") is None
        assert await store.get_trajectory("missing", "s1") is None

    @pytest.mark.asyncio
    async def test_list_traces_most_recent_first_and_resave_moves_to_front(
        self, store: InMemoryStateStore
    ) -> None:
        for trace_id in ("a", "b", "c"):
            await store.save_trajectory(trace_id, "s1", {"id": trace_id})
        assert await store.list_traces("s1") == ["c", "b", "a"]
        await store.save_trajectory("a", "s1", {"id": "a2"})
        assert await store.list_traces("s1") == ["a", "c", "b"]
        assert await store.list_traces("s1", limit=2) == ["a", "c"]
        assert await store.list_traces("s1", limit=0) == []
        assert await store.list_traces("none") == []
        assert await store.get_trajectory("a", "s1") == {"id": "a2"}

    @pytest.mark.asyncio
    async def test_a_trace_saved_under_another_session_stays_listed_as_penguiflows_reference(
        self, store: InMemoryStateStore
    ) -> None:
        await store.save_trajectory("tr", "s1", {"v": 1})
        await store.save_trajectory("tr", "s2", {"v": 2})
        assert await store.list_traces("s1") == ["tr"]
        assert await store.list_traces("s2") == ["tr"]
        assert await store.get_trajectory("tr", "s1") is None
        assert await store.get_trajectory("tr", "s2") == {"v": 2}

    @pytest.mark.asyncio
    async def test_serialisable_objects_come_back_as_their_class(self, store: InMemoryStateStore) -> None:
        register_trajectory_type(Recorder)
        original = Recorder(["plan", "act"])
        await store.save_trajectory("tr", "s1", original)
        original.steps.append("mutated")
        loaded = await store.get_trajectory("tr", "s1")
        assert isinstance(loaded, Recorder)
        assert loaded.steps == ["plan", "act"]


class TestPlannerEvents:
    @pytest.mark.asyncio
    async def test_emission_order_is_kept_and_identical_chunks_are_not_merged(
        self, store: InMemoryStateStore
    ) -> None:
        chunk = PlannerEvent("llm_stream_chunk", 5.0, extra={"text": "the"})
        for event in (planner_event(2), chunk, chunk, planner_event(1)):
            await store.save_planner_event("t1", event)
        assert await store.list_planner_events("t1") == [planner_event(2), chunk, chunk, planner_event(1)]
        assert await store.get_events("t1") == await store.list_planner_events("t1")
        assert await store.list_planner_events("other") == []


class TestBounds:
    @pytest.mark.asyncio
    async def test_events_drop_the_oldest_and_count_it(self, caplog: pytest.LogCaptureFixture) -> None:
        store = InMemoryStateStore(max_events_per_trace=3)
        with caplog.at_level(logging.WARNING, logger="backends.memory"):
            for index in range(5):
                await store.save_event(stored(float(index)))
        assert [event.ts for event in await store.load_history("t1")] == [2.0, 3.0, 4.0]
        assert store.dropped["events"] == 2
        assert len([r for r in caplog.records if "bound reached" in r.getMessage()]) == 1

    @pytest.mark.asyncio
    async def test_other_bounds(self) -> None:
        store = InMemoryStateStore(
            max_updates_per_session=2, max_steering_events_per_session=2, max_planner_events_per_trace=2
        )
        for index in range(4):
            await store.save_update(update(f"u{index}"))
            await store.save_steering(steering(f"e{index}"))
            await store.save_planner_event("t1", planner_event(index))
        assert [u.update_id for u in await store.list_updates("s1")] == ["u2", "u3"]
        assert [e.event_id for e in await store.list_steering("s1")] == ["e2", "e3"]
        assert [e.trajectory_step for e in await store.list_planner_events("t1")] == [2, 3]
        assert dict(store.dropped) == {"events": 0, "updates": 2, "steering": 2, "planner_events": 2}

    @pytest.mark.asyncio
    async def test_a_dropped_cursor_is_an_unknown_cursor(self) -> None:
        store = InMemoryStateStore(max_updates_per_session=2)
        for index in range(3):
            await store.save_update(update(f"u{index}"))
        assert [u.update_id for u in await store.list_updates("s1", since_id="u0")] == ["u1", "u2"]

    @pytest.mark.asyncio
    async def test_non_positive_bounds_are_unbounded(self) -> None:
        store = InMemoryStateStore(max_events_per_trace=0)
        for index in range(10):
            await store.save_event(stored(float(index)))
        assert len(await store.load_history("t1")) == 10
        assert store.dropped["events"] == 0

    def test_dropped_is_read_only(self, store: InMemoryStateStore) -> None:
        assert set(store.dropped) == set(DROP_KINDS)
        with pytest.raises(TypeError):
            store.dropped["events"] = 5  # type: ignore[index]


class TestConcurrency:
    @pytest.mark.asyncio
    async def test_many_concurrent_saves_lose_nothing(self, store: InMemoryStateStore) -> None:
        await asyncio.gather(
            *(store.save_event(stored(float(i % 7), i=i)) for i in range(500)),
            *(store.save_update(update(f"u{i}", task_id=f"task{i % 3}")) for i in range(500)),
            *(store.save_steering(steering(f"e{i}")) for i in range(200)),
            *(store.save_planner_event("t1", planner_event(i)) for i in range(300)),
            *(store.save_task(task(f"task{i}")) for i in range(100)),
        )
        history = await store.load_history("t1")
        assert sorted(event.payload["i"] for event in history) == list(range(500))
        assert [event.ts for event in history] == sorted(event.ts for event in history)
        assert len(await store.list_updates("s1", limit=10_000)) == 500
        assert len(await store.list_steering("s1", limit=10_000)) == 200
        assert [e.trajectory_step for e in await store.list_planner_events("t1")] == list(range(300))
        assert len(await store.list_tasks("s1")) == 100

    @pytest.mark.asyncio
    async def test_concurrent_duplicates_are_stored_once(self, store: InMemoryStateStore) -> None:
        await asyncio.gather(*(store.save_event(stored(1.0, a=1)) for _ in range(50)))
        await asyncio.gather(*(store.save_update(update("u1")) for _ in range(50)))
        assert len(await store.load_history("t1")) == 1
        assert len(await store.list_updates("s1")) == 1


class TestClearing:
    @pytest.mark.asyncio
    async def test_clear_session_forgets_the_session_and_its_traces(self, store: InMemoryStateStore) -> None:
        for session_id in ("s1", "s2"):
            await store.save_task(task(f"task-{session_id}", session_id=session_id))
            await store.save_update(update("u1", session_id=session_id))
            await store.save_steering(steering("e1", session_id=session_id))
            await store.save_trajectory(f"tr-{session_id}", session_id, {"q": 1})
            await store.save_planner_event(f"tr-{session_id}", planner_event(1))
            await store.save_event(stored(trace_id=f"tr-{session_id}"))
            await store.save_event(stored(trace_id=f"session:{session_id}"))
            await store.artifact_store.put_text(session_id, scope=None)
        await store.artifact_store.put_text("scoped", namespace="n", scope=_scope("s1"))
        store.clear_session("s1")
        assert await store.list_tasks("s1") == []
        assert await store.list_updates("s1") == []
        assert await store.list_steering("s1") == []
        assert await store.list_traces("s1") == []
        assert await store.get_trajectory("tr-s1", "s1") is None
        assert await store.list_planner_events("tr-s1") == []
        assert await store.load_history("tr-s1") == []
        assert await store.load_history("session:s1") == []
        assert await store.artifact_store.list(scope=_scope("s1")) == []
        assert len(await store.list_tasks("s2")) == 1
        assert len(await store.load_history("session:s2")) == 1
        await store.save_task(task("task-s1", session_id="s3"))
        assert len(await store.list_tasks("s3")) == 1

    @pytest.mark.asyncio
    async def test_clear_forgets_everything(self) -> None:
        store = InMemoryStateStore(max_events_per_trace=1)
        await store.save_event(stored(1.0))
        await store.save_event(stored(2.0))
        await store.save_memory_state("k", {"v": 1})
        await store.save_planner_state("tok", {"v": 1})
        await store.save_remote_binding(binding())
        await store.artifact_store.put_text("x")
        store.clear()
        assert await store.load_history("t1") == []
        assert store.dropped["events"] == 0
        assert await store.load_memory_state("k") is None
        assert await store.load_planner_state("tok") is None
        assert await store.list_bindings(router_session_id="rs") == []
        assert store.artifact_store.count == 0


def _scope(session_id: str) -> Any:
    from guarded.models import ArtifactScope

    return ArtifactScope(session_id=session_id)


@pytest.mark.asyncio
async def test_penguiflow_records_round_trip() -> None:
    pytest.importorskip("penguiflow")
    from penguiflow.planner import PlannerEvent as PfPlannerEvent
    from penguiflow.planner import Trajectory as PfTrajectory
    from penguiflow.state import models as pf

    snapshot = pf.TaskContextSnapshot(
        session_id="s1", task_id="task1", llm_context={"a": [1]}, context_version=2
    )
    records = {
        "event": pf.StoredEvent("t1", 1.5, "node_success", "n", "n-1", {"latency_ms": 3.2}),
        "task": pf.TaskState(
            task_id="task1",
            session_id="s1",
            status=pf.TaskStatus.COMPLETE,
            task_type=pf.TaskType.FOREGROUND,
            priority=2,
            context_snapshot=snapshot,
            result={"answer": 1},
        ),
        "update": pf.StateUpdate(
            session_id="s1", task_id="task1", update_id="u1", update_type=pf.UpdateType.RESULT, content=[1]
        ),
        "steering": pf.SteeringEvent(
            session_id="s1",
            task_id="task1",
            event_type=pf.SteeringEventType.APPROVE,
            payload={"patch_id": "p"},
        ),
        "planner_event": PfPlannerEvent("step_complete", 2.0, trajectory_step=1, extra={"k": "v"}),
        "binding": pf.RemoteBinding("t1", "c", "rt", "http://a", router_session_id="rs", remote_skill="sk"),
    }
    trajectory = PfTrajectory(query="what?", llm_context={"x": 1})

    async def save_all(store: InMemoryStateStore) -> None:
        await store.save_event(records["event"])
        await store.save_task(records["task"])
        await store.save_update(records["update"])
        await store.save_steering(records["steering"])
        await store.save_planner_event("t1", records["planner_event"])
        await store.save_remote_binding(records["binding"])
        await store.save_trajectory("t1", "s1", trajectory)

    async def load_all(store: InMemoryStateStore) -> dict[str, Any]:
        return {
            "event": (await store.load_history("t1"))[0],
            "task": (await store.list_tasks("s1"))[0],
            "update": (await store.list_updates("s1"))[0],
            "steering": (await store.list_steering("s1"))[0],
            "planner_event": (await store.list_planner_events("t1"))[0],
            "binding": await store.find_binding(
                router_session_id="rs", agent_url="http://a", remote_skill="sk"
            ),
        }

    ours = InMemoryStateStore()
    await save_all(ours)
    loaded = await load_all(ours)
    codecs: dict[str, RecordCodec[Any]] = {
        "event": STORED_EVENT,
        "task": TASK_STATE,
        "update": STATE_UPDATE,
        "steering": STEERING_EVENT,
        "planner_event": PLANNER_EVENT,
    }
    for name, codec in codecs.items():
        assert codec.encode(loaded[name]) == codec.encode(records[name]), name
    assert loaded["binding"].task_id == "rt"

    native = InMemoryStateStore(record_types=penguiflow_types())
    await save_all(native)
    assert await load_all(native) == records
    loaded_trajectory = await native.get_trajectory("t1", "s1")
    assert isinstance(loaded_trajectory, PfTrajectory)
    assert loaded_trajectory.serialise() == PfTrajectory.from_serialised(trajectory.serialise()).serialise()
