"""The hybrid's routing table: spec 000's default, overrides, and the tables it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backend import BULK_FORMS, LEGACY_ALIASES
from guarded.backends.hybrid_store import (
    DEFAULT_ROUTES,
    HOT,
    METHOD_GROUPS,
    RECORD,
    HybridStateStore,
    RoutingError,
    routing,
)
from guarded.backends.memory import InMemoryStateStore
from guarded.protocol import CAPABILITIES, SupportsMemoryState, SupportsPlannerState, SupportsTasks


def test_the_default_is_spec_000s_split() -> None:
    table = routing()
    hot = {method for method, part in table.items() if part == HOT}
    assert hot == {
        "save_planner_state",
        "load_planner_state",
        "save_planner_states",
        "save_memory_state",
        "load_memory_state",
        "save_memory_states",
        "list_memory_keys",
    }
    assert {
        group: HOT if group in ("pauses", "memory") else RECORD for group in METHOD_GROUPS
    } == DEFAULT_ROUTES


def test_every_protocol_method_bulk_form_and_alias_is_routed() -> None:
    table = routing()
    protocol = {method for capability in CAPABILITIES for method in capability.methods}
    assert protocol | set(BULK_FORMS.values()) | set(LEGACY_ALIASES) == set(table)


def test_bulk_forms_and_aliases_follow_their_method() -> None:
    table = routing({"tasks": HOT, "planner_events": HOT, "updates": HOT})
    assert table["save_tasks"] == table["save_task"] == HOT
    assert table["get_events"] == table["save_planner_events"] == HOT
    assert table["save_task_update"] == table["list_task_updates"] == table["save_updates"] == HOT
    assert table["save_events"] == RECORD


def test_a_group_is_routed_whole_by_its_name_or_method_by_method() -> None:
    by_group = routing({"pauses": RECORD})
    by_method = routing({"save_planner_state": RECORD, "load_planner_state": RECORD})
    assert by_group == by_method
    assert by_group["save_planner_states"] == RECORD


@pytest.mark.parametrize(
    ("routes", "says"),
    [
        (
            {"save_planner_state": RECORD},
            "the pauses group is split (save_planner_state -> record, load_planner_state -> hot)",
        ),
        ({"list_memory_keys": RECORD}, "the memory group is split"),
        ({"pauses": "redis"}, "routes['pauses'] = 'redis': no such part; parts: hot, record"),
        ({"tasks": "recrod"}, "no such part (did you mean 'record'?)"),
        ({"save_evnt": HOT}, "routes['save_evnt']: no such method or group (did you mean 'save_event'?)"),
        ({"sessions": HOT}, "routes['sessions']: no such method or group"),
        ({"save_memory_states": RECORD}, "save_memory_states goes where save_memory_state goes"),
        ({"get_events": HOT}, "get_events goes where list_planner_events goes"),
    ],
)
def test_a_table_it_cannot_follow_is_refused_naming_what(routes: dict[str, str], says: str) -> None:
    with pytest.raises(RoutingError) as raised:
        HybridStateStore(hot=InMemoryStateStore(), record=InMemoryStateStore(), routes=routes)
    assert says in str(raised.value)


def test_write_through_needs_memory_on_the_hot_part() -> None:
    with pytest.raises(RoutingError, match="memory is routed to 'record'"):
        HybridStateStore(
            hot=InMemoryStateStore(),
            record=InMemoryStateStore(),
            routes={"memory": RECORD},
            memory_write_through=True,
        )


class PausesAndMemoryOnly:
    """A hot store with only pauses and memory (no core methods)."""

    def __init__(self) -> None:
        self.inner = InMemoryStateStore()

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        await self.inner.save_planner_state(token, payload)

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        return await self.inner.load_planner_state(token)

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        await self.inner.save_memory_state(key, state)

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        return await self.inner.load_memory_state(key)


@pytest.mark.asyncio
async def test_the_hybrid_offers_what_the_routed_parts_offer() -> None:
    hybrid = HybridStateStore(hot=PausesAndMemoryOnly(), record=InMemoryStateStore())
    assert isinstance(hybrid, SupportsPlannerState)
    assert isinstance(hybrid, SupportsMemoryState)
    assert isinstance(hybrid, SupportsTasks)
    assert not hasattr(hybrid, "list_memory_keys")  # routed to the hot part, which has none
    assert not hasattr(hybrid, "save_planner_states")
    assert hybrid.part_of("save_event") == RECORD
    assert "save_event" in dir(hybrid)
    assert "list_memory_keys" not in dir(hybrid)
    with pytest.raises(AttributeError):
        hybrid.no_such_method  # noqa: B018
    # A part with only the methods routed to it is guarded like any store.
    store = guard(hybrid, registry=CollectorRegistry(), spill_path=None)
    async with store:
        await store.save_planner_state("p1", {"step": 1})
        assert await store.load_planner_state("p1") == {"step": 1}
        assert await store.load_planner_state("p1") is None
        await store.save_memory_state("k:u:s", {"turns": 1})
        assert await store.load_memory_state("k:u:s") == {"turns": 1}
        assert not hasattr(store, "list_memory_keys")
    stats = controller(store).parts[HOT].stats()
    assert stats[("save_planner_state", "ok")] == 1
    assert ("save_planner_state", "ok") not in controller(store).parts[RECORD].stats()


def test_an_unguarded_hybrid_has_no_controller() -> None:
    hybrid = HybridStateStore(hot=InMemoryStateStore(), record=InMemoryStateStore())
    with pytest.raises(TypeError, match="is not a guarded store"):
        controller(hybrid)


def test_the_hybrid_without_the_required_methods_is_refused_by_the_guard() -> None:
    hybrid = HybridStateStore(hot=InMemoryStateStore(), record=PausesAndMemoryOnly())
    with pytest.raises(TypeError, match="has no save_event, load_history, save_remote_binding"):
        guard(hybrid, registry=CollectorRegistry(), spill_path=None)
