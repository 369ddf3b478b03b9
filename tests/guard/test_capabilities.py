"""guard(store) has exactly the capabilities of store, and FaultyStore(store) too."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import GuardedArtifactStore, GuardedStore, controller, guard
from guarded.models import StateUpdate
from guarded.policy import Fallback, Kind
from guarded.protocol import CAPABILITIES, LEGACY_ALIASES, StateStore, SupportsArtifacts
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.broken_stores import MinimalStore
from tests.support.metrics import calls

from .support import fast_config

PROBE_NAMES = sorted(
    {method for capability in CAPABILITIES for method in capability.methods}
    | set(LEGACY_ALIASES)
    | {
        "artifact_store",
        "aclose",
        "close",
        "clear",
        "clear_session",
        "dropped",
        "honours_idempotency_key",
        "db_system_name",
        "save_events",
        "not_a_store_method",
        "_lock",
        "_seq",
        "_private_missing",
    }
)
"""Every protocol name, the aliases, and names some stores have and others lack."""

STORES: dict[str, Callable[[], Any]] = {"minimal": MinimalStore, "memory": InMemoryStateStore}


def names_of(store: object) -> list[str]:
    return sorted({*PROBE_NAMES, *(name for name in dir(store) if not name.startswith("__"))})


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> Any:
    return STORES[request.param]()


@pytest.mark.parametrize("wrapper", ["guard", "faulty", "guard(faulty)"])
def test_hasattr_and_dir_are_the_stores(store: Any, wrapper: str) -> None:
    if wrapper == "guard":
        proxy = guard(store, registry=CollectorRegistry())
    elif wrapper == "faulty":
        proxy = FaultyStore(store)
    else:
        proxy = guard(FaultyStore(store), registry=CollectorRegistry())
    mismatched = [name for name in names_of(store) if hasattr(proxy, name) != hasattr(store, name)]
    assert mismatched == []
    assert dir(proxy) == dir(store)
    for name in ("save_event", "load_history", "save_remote_binding"):
        assert inspect.iscoroutinefunction(getattr(proxy, name))
    # PenguiFlow's capability probe
    assert (getattr(proxy, "save_planner_state", None) is None) == (
        getattr(store, "save_planner_state", None) is None
    )


@pytest.mark.parametrize("wrapper", ["guard", "faulty"])
def test_isinstance_answers_as_for_the_store(store: Any, wrapper: str) -> None:
    proxy = guard(store, registry=CollectorRegistry()) if wrapper == "guard" else FaultyStore(store)
    answers = {
        cap.name: (isinstance(proxy, cap.protocol), isinstance(store, cap.protocol)) for cap in CAPABILITIES
    }
    assert all(mine == theirs for mine, theirs in answers.values()), answers
    assert isinstance(proxy, StateStore)


def test_minimal_store_offers_only_the_core() -> None:
    proxy = guard(MinimalStore(), registry=CollectorRegistry())
    offered = [cap.name for cap in CAPABILITIES if isinstance(proxy, cap.protocol)]
    assert offered == ["core"]
    assert not hasattr(proxy, "artifact_store")
    assert controller(proxy).guarded_methods() == ["load_history", "save_event", "save_remote_binding"]


def test_full_store_offers_every_capability_and_guards_every_async_method() -> None:
    store = InMemoryStateStore()
    proxy = guard(store, registry=CollectorRegistry())
    assert all(isinstance(proxy, cap.protocol) for cap in CAPABILITIES)
    expected = sorted(
        name
        for name in dir(store)
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(store, name))
    )
    assert controller(proxy).guarded_methods() == expected
    assert "clear" not in expected  # sync methods pass through


class Configured(InMemoryStateStore):
    db_system_name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.label = "primary"

    def describe(self) -> str:
        return f"store {self.label}"


def test_non_async_attributes_pass_through_and_setattr_reaches_the_store() -> None:
    store = Configured()
    proxy = guard(store, registry=CollectorRegistry())
    assert proxy.label == "primary"
    assert proxy.db_system_name == "memory"
    assert proxy.describe() == "store primary"
    assert proxy.clear.__self__ is store  # a sync method is the store's own bound method
    assert dict(proxy.dropped) == dict(store.dropped)

    proxy.label = "secondary"
    assert store.label == "secondary"
    assert proxy.describe() == "store secondary"
    proxy.added_later = 42
    assert store.added_later == 42  # type: ignore[attr-defined]
    assert proxy.added_later == 42
    assert hasattr(proxy, "added_later")
    del proxy.label
    assert not hasattr(store, "label")
    assert not hasattr(proxy, "label")


@pytest.mark.asyncio
async def test_artifact_store_is_guarded_and_discoverable() -> None:
    registry = CollectorRegistry()
    store = InMemoryStateStore()
    faulty = FaultyStore(
        store, FaultPlan.always(Fault.error_before(RuntimeError), methods=["artifact_store.get"])
    )
    proxy = guard(faulty, registry=registry, config=fast_config())

    assert isinstance(proxy, SupportsArtifacts)
    artifacts = proxy.artifact_store
    assert isinstance(artifacts, GuardedArtifactStore)
    assert proxy.artifact_store is artifacts  # built once
    inner_artifacts = store.artifact_store
    for name in (
        "put_bytes",
        "put_text",
        "get",
        "get_ref",
        "exists",
        "list",
        "delete",
        "clear",
        "count",
        "nope",
    ):
        assert hasattr(artifacts, name) == hasattr(inner_artifacts, name), name
    assert {"get", "put_bytes", "exists", "list", "delete"} <= set(controller(artifacts).guarded_methods())

    ref = await artifacts.put_bytes(b"hello", mime_type="text/plain")
    assert await artifacts.exists(ref.id) is True
    assert await store.artifact_store.get(ref.id) == b"hello"
    assert await artifacts.get(ref.id) is None  # the injected failure became the fallback
    assert calls(registry, "artifact_store.get", "fallback") == 1
    assert calls(registry, "artifact_store.exists", "ok") == 1
    assert [record.method for record in fault_injector(faulty).log] == [
        "artifact_store.put_bytes",
        "artifact_store.exists",
        "artifact_store.get",
    ]


class NoArtifacts(MinimalStore):
    @property
    def artifact_store(self) -> None:
        return None


def test_artifact_store_none_stays_none() -> None:
    proxy = guard(NoArtifacts(), registry=CollectorRegistry())
    assert hasattr(proxy, "artifact_store")
    assert proxy.artifact_store is None


@pytest.mark.parametrize(("alias", "target"), sorted(LEGACY_ALIASES.items()))
def test_legacy_aliases_take_their_targets_policy(alias: str, target: str) -> None:
    proxy = guard(InMemoryStateStore(), registry=CollectorRegistry())
    policy, target_policy = controller(proxy).policy(alias), controller(proxy).policy(target)
    assert policy.alias_of == target
    assert not policy.inferred
    assert (policy.kind, policy.fallback, policy.repeat_safe, policy.dead_letter, policy.batch) == (
        target_policy.kind,
        target_policy.fallback,
        target_policy.repeat_safe,
        target_policy.dead_letter,
        target_policy.batch,
    )


@pytest.mark.asyncio
async def test_legacy_alias_failure_returns_the_targets_fallback() -> None:
    registry = CollectorRegistry()
    store = InMemoryStateStore()
    faulty = FaultyStore(store, FaultPlan.always(Fault.error_before(RuntimeError), methods=["get_events"]))
    proxy = guard(faulty, registry=registry, config=fast_config())
    # A name-inferred policy would make get_events a single-item read falling back to None.
    assert controller(proxy).policy("get_events").kind is Kind.READ
    assert controller(proxy).policy("get_events").fallback is Fallback.EMPTY_LIST
    assert await proxy.get_events("t1") == []
    assert calls(registry, "get_events", "fallback") == 1

    update = StateUpdate(session_id="s1", task_id="t1", update_type="PROGRESS", content={"p": 1})
    await proxy.save_task_update(update)
    assert [u.update_id for u in await proxy.list_task_updates("s1")] == [update.update_id]
    assert calls(registry, "save_task_update", "ok") == 1
    assert calls(registry, "list_task_updates", "ok") == 1


class AsyncClosing(MinimalStore):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


class SyncClosing(MinimalStore):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("kind", [AsyncClosing, SyncClosing])
@pytest.mark.asyncio
async def test_async_context_manager_closes_the_inner_store(kind: type[AsyncClosing | SyncClosing]) -> None:
    store = kind()
    proxy = guard(store, registry=CollectorRegistry())
    async with proxy as entered:
        assert entered is proxy
        assert store.closed == 0
    assert store.closed == 1


@pytest.mark.asyncio
async def test_context_manager_without_close_is_fine() -> None:
    async with guard(MinimalStore(), registry=CollectorRegistry()) as proxy:
        assert await proxy.load_history("t") == []


def test_controller_of_a_proxy_and_of_anything_else() -> None:
    store = InMemoryStateStore()
    proxy = guard(store, name="primary", registry=CollectorRegistry())
    control = controller(proxy)
    assert control.store is store
    assert control.name == "primary"
    assert isinstance(proxy, GuardedStore)
    assert "primary" in repr(proxy)
    for not_a_proxy in (store, object(), None, FaultyStore(store)):
        with pytest.raises(TypeError, match="not a guarded store"):
            controller(not_a_proxy)
    with pytest.raises(TypeError, match="not a FaultyStore"):
        fault_injector(proxy)


@pytest.mark.asyncio
async def test_controller_stats_count_calls_by_method_and_outcome() -> None:
    store = guard(InMemoryStateStore(), name="stats", registry=CollectorRegistry())
    await store.load_memory_state("missing")
    await store.load_memory_state("missing")
    await store.save_memory_state("k", {"a": 1})
    await store.artifact_store.exists("nope")
    assert controller(store).stats() == {
        ("load_memory_state", "not_found"): 2,
        ("save_memory_state", "ok"): 1,
        ("artifact_store.exists", "ok"): 1,
    }
