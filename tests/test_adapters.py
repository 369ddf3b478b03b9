"""Compatibility adapters: current names first, legacy names second, a clear error for neither."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import pytest

from guarded.adapters import (
    get_artifact_store,
    is_legacy_save_event,
    list_planner_events_compat,
    list_steering_compat,
    list_tasks_compat,
    list_updates_compat,
    maybe_save_remote_binding,
    save_planner_event_compat,
    save_steering_compat,
    save_task_compat,
    save_update_compat,
)
from guarded.errors import CapabilityError
from guarded.models import (
    ArtifactRef,
    ArtifactScope,
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


def _update(update_id: str, task_id: str = "t1") -> StateUpdate:
    return StateUpdate(
        session_id="s1",
        task_id=task_id,
        update_id=update_id,
        update_type=UpdateType.PROGRESS,
        content=update_id,
    )


def _task(task_id: str = "t1") -> TaskState:
    return TaskState(
        task_id=task_id,
        session_id="s1",
        status=TaskStatus.RUNNING,
        task_type=TaskType.BACKGROUND,
        priority=1,
        context_snapshot=TaskContextSnapshot(session_id="s1", task_id=task_id),
    )


def _steering(event_id: str, task_id: str = "t1") -> SteeringEvent:
    return SteeringEvent(
        session_id="s1",
        task_id=task_id,
        event_id=event_id,
        event_type=SteeringEventType.INJECT_CONTEXT,
        payload={"text": event_id},
    )


def _page(
    items: Sequence[Any], id_attr: str, task_id: str | None, since_id: str | None, limit: int
) -> list[Any]:
    """The cursor rules of list_updates / list_steering, enough for these tests."""
    selected = [item for item in items if task_id is None or item.task_id == task_id]
    if since_id is not None:
        ids = [getattr(item, id_attr) for item in selected]
        selected = selected[ids.index(since_id) + 1 :] if since_id in ids else []
    return selected[:limit]


class CoreStore:
    """Only the three required methods, with the core ``save_event(event)``."""

    def __init__(self) -> None:
        self.events: list[StoredEvent] = []
        self.bindings: list[RemoteBinding] = []

    async def save_event(self, event: StoredEvent) -> None:
        if not isinstance(event, StoredEvent):
            raise TypeError("save_event expects a StoredEvent")
        self.events.append(event)

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        return [event for event in self.events if event.trace_id == trace_id]

    async def save_remote_binding(self, binding: RemoteBinding) -> None:
        self.bindings.append(binding)


class NewStore(CoreStore):
    """Current method names only; list methods return tuples to check the adapters make lists."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[StateUpdate] = []
        self.tasks: dict[str, TaskState] = {}
        self.steering: list[SteeringEvent] = []
        self.planner_events: dict[str, list[PlannerEvent]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def save_update(self, update: StateUpdate) -> None:
        self.updates.append(update)

    async def list_updates(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> Sequence[StateUpdate]:
        self.calls.append(("list_updates", {"task_id": task_id, "since_id": since_id, "limit": limit}))
        mine = [update for update in self.updates if update.session_id == session_id]
        return tuple(_page(mine, "update_id", task_id, since_id, limit))

    async def save_task(self, state: TaskState) -> None:
        self.tasks[state.task_id] = state

    async def list_tasks(self, session_id: str) -> Sequence[TaskState]:
        return tuple(task for task in self.tasks.values() if task.session_id == session_id)

    async def save_steering(self, event: SteeringEvent) -> None:
        self.steering.append(event)

    async def list_steering(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> Sequence[SteeringEvent]:
        self.calls.append(("list_steering", {"task_id": task_id, "since_id": since_id, "limit": limit}))
        mine = [event for event in self.steering if event.session_id == session_id]
        return tuple(_page(mine, "event_id", task_id, since_id, limit))

    async def save_planner_event(self, trace_id: str, event: PlannerEvent) -> None:
        self.planner_events.setdefault(trace_id, []).append(event)

    async def list_planner_events(self, trace_id: str) -> list[PlannerEvent]:
        return list(self.planner_events.get(trace_id, []))


class LegacyStore:
    """A pre-rename task service plus a Playground store: legacy names only."""

    def __init__(self) -> None:
        self.updates: list[StateUpdate] = []
        self.planner_events: dict[str, list[PlannerEvent]] = {}

    async def save_task_update(self, update: StateUpdate) -> None:
        self.updates.append(update)

    async def list_task_updates(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> Sequence[StateUpdate]:
        mine = [update for update in self.updates if update.session_id == session_id]
        return tuple(_page(mine, "update_id", task_id, since_id, limit))

    async def save_event(self, trace_id: str, event: PlannerEvent) -> None:
        self.planner_events.setdefault(trace_id, []).append(event)

    async def get_events(self, trace_id: str) -> Sequence[PlannerEvent]:
        return tuple(self.planner_events.get(trace_id, []))


class BothStore(NewStore):
    """Has both names; the legacy ones must never be called."""

    async def save_task_update(self, update: StateUpdate) -> None:
        raise AssertionError("legacy save_task_update called although save_update exists")

    async def list_task_updates(self, session_id: str, **kwargs: Any) -> Sequence[StateUpdate]:
        raise AssertionError("legacy list_task_updates called although list_updates exists")

    async def get_events(self, trace_id: str) -> Sequence[PlannerEvent]:
        raise AssertionError("legacy get_events called although list_planner_events exists")


# --- current names ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_new_names_tasks_updates_steering() -> None:
    store = NewStore()
    for update_id in ("u1", "u2", "u3"):
        await save_update_compat(store, _update(update_id))
    await save_update_compat(store, _update("other", task_id="t2"))
    await save_task_compat(store, _task("t1"))
    await save_steering_compat(store, _steering("e1"))
    await save_steering_compat(store, _steering("e2"))

    updates = await list_updates_compat(store, "s1", task_id="t1", since_id="u1", limit=1)
    assert updates == [store.updates[1]]
    assert type(updates) is list
    assert store.calls[-1] == ("list_updates", {"task_id": "t1", "since_id": "u1", "limit": 1})
    assert [u.update_id for u in await list_updates_compat(store, "s1")] == ["u1", "u2", "u3", "other"]
    assert store.calls[-1] == ("list_updates", {"task_id": None, "since_id": None, "limit": 500})

    tasks = await list_tasks_compat(store, "s1")
    assert tasks == [store.tasks["t1"]]
    assert type(tasks) is list
    assert await list_tasks_compat(store, "unknown") == []

    steering = await list_steering_compat(store, "s1", since_id="e1")
    assert [event.event_id for event in steering] == ["e2"]
    assert type(steering) is list
    assert store.calls[-1] == ("list_steering", {"task_id": None, "since_id": "e1", "limit": 500})


@pytest.mark.asyncio
async def test_new_names_planner_events() -> None:
    store = NewStore()
    event = PlannerEvent(event_type="stream_chunk", ts=1.0, trajectory_step=0, extra={"text": "hi"})
    await save_planner_event_compat(store, "trace-1", event)
    assert await list_planner_events_compat(store, "trace-1") == [event]
    assert await list_planner_events_compat(store, "trace-2") == []
    assert store.events == [], "the planner event must not reach the core audit log"


@pytest.mark.asyncio
async def test_new_names_win_over_legacy() -> None:
    store = BothStore()
    await save_update_compat(store, _update("u1"))
    assert [u.update_id for u in await list_updates_compat(store, "s1")] == ["u1"]
    event = PlannerEvent(event_type="step_complete", ts=2.0, trajectory_step=1)
    await save_planner_event_compat(store, "trace-1", event)
    assert await list_planner_events_compat(store, "trace-1") == [event]


# --- legacy names -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_legacy_names() -> None:
    store = LegacyStore()
    await save_update_compat(store, _update("u1"))
    await save_update_compat(store, _update("u2"))
    updates = await list_updates_compat(store, "s1", since_id="u1")
    assert [u.update_id for u in updates] == ["u2"]
    assert type(updates) is list

    event = PlannerEvent(event_type="llm_stream_chunk", ts=3.5, trajectory_step=2, extra={"done": False})
    await save_planner_event_compat(store, "trace-1", event)
    assert store.planner_events == {"trace-1": [event]}
    events = await list_planner_events_compat(store, "trace-1")
    assert events == [event]
    assert type(events) is list


@pytest.mark.asyncio
async def test_legacy_save_event_error_propagates_unchanged() -> None:
    """A TypeError raised *inside* a legacy save_event is the store's error, not a missing method."""

    class Broken(LegacyStore):
        async def save_event(self, trace_id: str, event: PlannerEvent) -> None:
            raise TypeError("broken inside the store")

    with pytest.raises(TypeError, match="broken inside the store") as info:
        await save_planner_event_compat(Broken(), "trace-1", PlannerEvent(event_type="x", ts=0.0))
    assert not isinstance(info.value, CapabilityError)


@pytest.mark.asyncio
async def test_wrapped_legacy_save_event_is_recognised() -> None:
    """A decorator made with functools.wraps keeps the (trace_id, event) signature visible."""

    def logged(func: Any) -> Any:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, **kwargs)

        return wrapper

    class Wrapped:
        def __init__(self) -> None:
            self.saved: list[tuple[str, PlannerEvent]] = []

        @logged
        async def save_event(self, trace_id: str, event: PlannerEvent) -> None:
            self.saved.append((trace_id, event))

    store = Wrapped()
    event = PlannerEvent(event_type="x", ts=0.0)
    await save_planner_event_compat(store, "trace-1", event)
    assert store.saved == [("trace-1", event)]


# --- neither ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_core_save_event_is_never_called_with_two_arguments() -> None:
    store = CoreStore()
    with pytest.raises(CapabilityError) as info:
        await save_planner_event_compat(store, "trace-1", PlannerEvent(event_type="x", ts=0.0))
    assert isinstance(info.value, TypeError)
    assert "save_planner_event" in str(info.value)
    assert "save_event(trace_id, event)" in str(info.value)
    assert store.events == []


@pytest.mark.asyncio
async def test_ambiguous_save_event_is_not_taken_for_legacy() -> None:
    calls: list[tuple[Any, ...]] = []

    class Permissive:
        async def save_event(self, *args: Any) -> None:
            calls.append(args)

    with pytest.raises(CapabilityError):
        await save_planner_event_compat(Permissive(), "trace-1", PlannerEvent(event_type="x", ts=0.0))
    assert calls == []


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda store: save_update_compat(store, _update("u1")), ("save_update", "save_task_update")),
        (lambda store: list_updates_compat(store, "s1"), ("list_updates", "list_task_updates")),
        (
            lambda store: save_planner_event_compat(store, "t", PlannerEvent(event_type="x", ts=0.0)),
            ("save_planner_event", "save_event"),
        ),
        (lambda store: list_planner_events_compat(store, "t"), ("list_planner_events", "get_events")),
        (lambda store: save_task_compat(store, _task()), ("save_task",)),
        (lambda store: list_tasks_compat(store, "s1"), ("list_tasks",)),
        (lambda store: save_steering_compat(store, _steering("e1")), ("save_steering",)),
        (lambda store: list_steering_compat(store, "s1"), ("list_steering",)),
    ],
)
@pytest.mark.asyncio
async def test_neither_name_raises_capability_error(call: Any, names: tuple[str, ...]) -> None:
    with pytest.raises(CapabilityError) as info:
        await call(CoreStore())
    assert isinstance(info.value, TypeError)
    for name in names:
        assert name in str(info.value)
    assert "CoreStore" in str(info.value)


@pytest.mark.asyncio
async def test_non_callable_attribute_does_not_count() -> None:
    class Odd(CoreStore):
        save_update = None
        list_updates = "not a method"

    with pytest.raises(CapabilityError):
        await save_update_compat(Odd(), _update("u1"))
    with pytest.raises(CapabilityError):
        await list_updates_compat(Odd(), "s1")


# --- remote bindings and artifacts ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_maybe_save_remote_binding() -> None:
    binding = RemoteBinding(trace_id="trace-1", context_id=None, task_id="a2a-1", agent_url="http://agent")
    await maybe_save_remote_binding(None, binding)  # no store configured: a no-op
    store = CoreStore()
    await maybe_save_remote_binding(store, binding)
    assert store.bindings == [binding]
    with pytest.raises(CapabilityError, match="save_remote_binding"):
        await maybe_save_remote_binding(object(), binding)


class _Artifacts:
    async def put_bytes(self, data: bytes, **kwargs: Any) -> ArtifactRef:
        return ArtifactRef(id="a")

    async def put_text(self, text: str, **kwargs: Any) -> ArtifactRef:
        return ArtifactRef(id="a")

    async def get(self, artifact_id: str) -> bytes | None:
        return None

    async def get_ref(self, artifact_id: str) -> ArtifactRef | None:
        return None

    async def delete(self, artifact_id: str) -> bool:
        return False

    async def exists(self, artifact_id: str) -> bool:
        return False

    async def list(self, *, scope: ArtifactScope | None = None) -> list[ArtifactRef]:
        return []


@pytest.mark.asyncio
async def test_get_artifact_store() -> None:
    artifacts = _Artifacts()

    class WithArtifacts(CoreStore):
        @property
        def artifact_store(self) -> _Artifacts:
            return artifacts

    class WithoutArtifacts(CoreStore):
        artifact_store = None

    assert get_artifact_store(WithArtifacts()) is artifacts
    assert get_artifact_store(WithoutArtifacts()) is None
    assert get_artifact_store(CoreStore()) is None
    assert get_artifact_store(artifacts) is artifacts


# --- signature detection ----------------------------------------------------------------------------


def test_is_legacy_save_event() -> None:
    async def legacy(trace_id: str, event: Any) -> None: ...
    async def core(event: Any) -> None: ...
    async def core_with_options(event: Any, *, durable: bool = True) -> None: ...
    async def optional_second(event: Any, extra: Any = None) -> None: ...
    async def var_args(*args: Any) -> None: ...

    assert is_legacy_save_event(legacy)
    assert is_legacy_save_event(LegacyStore().save_event)
    assert not is_legacy_save_event(core)
    assert not is_legacy_save_event(CoreStore().save_event)
    assert not is_legacy_save_event(core_with_options)
    assert not is_legacy_save_event(optional_second)
    assert not is_legacy_save_event(var_args)
    assert not is_legacy_save_event(print)  # builtins may have no inspectable signature


# --- the same choices as PenguiFlow's own adapters --------------------------------------------------


@pytest.mark.asyncio
async def test_matches_penguiflow_adapters() -> None:
    pf = pytest.importorskip("penguiflow.state.adapters")
    for make in (NewStore, LegacyStore, BothStore):
        ours, theirs = make(), make()
        update = _update("u1")
        await save_update_compat(ours, update)
        await pf.save_update_compat(theirs, update)
        assert await list_updates_compat(ours, "s1") == await pf.list_updates_compat(theirs, "s1")
        event = PlannerEvent(event_type="x", ts=1.0, trajectory_step=0)
        await save_planner_event_compat(ours, "t", event)
        await pf.save_planner_event_compat(theirs, "t", event)
        assert await list_planner_events_compat(ours, "t") == await pf.list_planner_events_compat(theirs, "t")
