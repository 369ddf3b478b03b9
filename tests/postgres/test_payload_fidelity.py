"""Payload fidelity: exact round trips (NUL, floats, key order), the NUL escape of text columns."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.backends.postgres.json_codec import (
    NULL_KEY,
    dump_json,
    from_db_text,
    key_text,
    to_db_text,
)
from guarded.models import PlannerEvent, RemoteBinding, StoredEvent

from .conftest import SMALL_POOL

# Strings that exercise the escape: NUL, the sentinel and its two escape partners, everything else.
tricky_text = st.text(
    alphabet=st.sampled_from(["\x00", "\ue000", "\ue001", "\ue002", "a", "\\", '"', "é", "🐧", "\u2028"]),
    max_size=12,
) | st.text(max_size=20)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=20,
)


def same(expected: Any, actual: Any) -> bool:
    """Exact equality: types, float signs and key order included."""
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and list(expected) == list(actual)
            and all(same(expected[key], actual[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(same(a, b) for a, b in zip(expected, actual, strict=True))
        )
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, float):
        return expected == actual and math.copysign(1, expected) == math.copysign(1, actual)
    return bool(expected == actual)


@given(tricky_text)
def test_text_escape_round_trips(value: str) -> None:
    escaped = to_db_text(value)
    assert "\x00" not in escaped
    assert from_db_text(escaped) == value
    assert key_text(value) != NULL_KEY


@given(st.text(alphabet=st.characters(exclude_characters="\x00\ue000")))
def test_text_without_nul_or_sentinel_is_stored_unchanged(value: str) -> None:
    assert to_db_text(value) == value


@given(tricky_text, tricky_text)
def test_text_escape_is_injective(first: str, second: str) -> None:
    if first != second:
        assert to_db_text(first) != to_db_text(second)


@pytest.fixture
def sync_store(
    pg_dsn: str, schema_name: str
) -> Iterator[tuple[asyncio.AbstractEventLoop, PostgresStateStore]]:
    """A store on a private event loop, for Hypothesis (which drives sync test functions)."""
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(
        PostgresStateStore.connect(
            pg_dsn, schema=schema_name, registry=CollectorRegistry(), stats_interval=None, pool=SMALL_POOL
        )
    )
    yield loop, store
    loop.run_until_complete(store.close())
    loop.close()


def test_any_json_payload_round_trips_exactly_through_postgres(
    sync_store: tuple[asyncio.AbstractEventLoop, PostgresStateStore],
) -> None:
    loop, store = sync_store
    counter = iter(range(1_000_000))

    async def round_trip(payload: dict[str, Any]) -> None:
        key = f"k{next(counter)}"
        await store.save_memory_state(key, payload)
        assert same(payload, await store.load_memory_state(key))
        await store.save_event(StoredEvent(key, 1.0, "k", None, None, payload))
        [event] = await store.load_history(key)
        assert same(payload, event.payload)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.dictionaries(tricky_text, json_values, max_size=5))
    def check(payload: dict[str, Any]) -> None:
        loop.run_until_complete(round_trip(payload))

    check()


@pytest.mark.asyncio
async def test_values_jsonb_would_change_round_trip(store: PostgresStateStore) -> None:
    payload = {
        "b": 1e16,
        "a": 1.5e300,
        "neg_zero": -0.0,
        "tiny": 5e-324,
        "big": 2**80,
        "nul": "x\x00y",
        "key\x00with nul": "\x00",
        "sentinel": "\ue000\ue001\ue002",
    }
    await store.save_planner_state("tok", payload)
    loaded = await store.load_planner_state("tok")
    assert same(payload, loaded)
    assert list(loaded or {}) == list(payload)


@pytest.mark.asyncio
async def test_nul_in_identifier_and_text_columns(store: PostgresStateStore) -> None:
    trace = "trace\x00with-nul\ue000"
    event = StoredEvent(trace, 1.0, "kind\x00", "node\x00", "id\ue001", {"x": 1})
    await store.save_event(event)
    assert await store.load_history(trace) == [event]
    assert await store.load_history("trace") == []
    binding = RemoteBinding(
        trace, "ctx\x00", "task\x00", "http://a\x00", router_session_id="r\x00", remote_skill="s"
    )
    await store.save_remote_binding(binding)
    assert await store.list_bindings(router_session_id="r\x00") == [binding]
    planner = PlannerEvent("chunk\x00", 1.0, 1, thought="t\x00", error="e\x00", extra={"\x00": "\x00"})
    await store.save_planner_event(trace, planner)
    assert await store.list_planner_events(trace) == [planner]


@pytest.mark.asyncio
async def test_sql_looking_strings_are_stored_verbatim(store: PostgresStateStore, raw: Any) -> None:
    nasty = [
        "'; DROP TABLE flow_events; --",
        'Robert"); DROP SCHEMA public CASCADE;--',
        "$1 $2 $$ $tag$ E'\\x00'",
        "1 OR 1=1",
        "\\'\\\"",
    ]
    for index, text in enumerate(nasty):
        event = StoredEvent(text, float(index), text, text, text, {text: text})
        await store.save_event(event)
        assert await store.load_history(text) == [event]
        await store.save_memory_state(text, {"v": text})
        assert await store.load_memory_state(text) == {"v": text}
    count = await raw.fetchval(f'SELECT count(*) FROM "{store.schema}".flow_events')
    assert count == len(nasty)


def test_dump_json_keeps_key_order_and_compacts() -> None:
    assert dump_json({"b": 1, "a": [1.0, None]}) == '{"b":1,"a":[1.0,null]}'
    assert json.loads(dump_json({"t": (1, 2)})) == {"t": [1, 2]}
