"""PenguiFlow's runtime audit log on ``guard(PostgresStateStore)``.

PenguiFlow's ``PenguiFlow(..., state_store=store)`` calls ``save_event(StoredEvent.from_flow_event(e))``
for every ``FlowEvent`` it emits and ``flow.load_history(trace_id)`` is ``store.load_history``
(spec 000, "Integration Points: PenguiFlow Core Runtime"). History is ordered by ``ts`` (spec 000,
"Ordering Guarantees"); the guard batches ``save_event`` (write-behind) and flushes a trace's
pending events before reading it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest
from penguiflow.errors import FlowError, FlowErrorCode
from penguiflow.metrics import FlowEvent
from penguiflow.state.models import StoredEvent
from prometheus_client import CollectorRegistry

from guarded import GuardConfig, controller
from guarded.config import BatchConfig
from guarded.models import GLOBAL_TRACE_ID
from tests.postgres.conftest import SMALL_POOL, StoreFactory

from .support import FATAL, NODE_NAMES, audited_flow, guarded_postgres, run_messages

pytestmark = pytest.mark.asyncio

START, SUCCESS, ERROR, RETRY, FAILED = "node_start", "node_success", "node_error", "node_retry", "node_failed"

EXPECTED_BY_NODE = {
    "ok": {
        "parse": [START, SUCCESS],
        "enrich": [START, ERROR, RETRY, START, SUCCESS],
        "finish": [START, SUCCESS],
    },
    FATAL: {
        "parse": [START, SUCCESS],
        "enrich": [START, ERROR, RETRY, START, ERROR, FAILED],
    },
}


def by_node(kinds_and_nodes: Sequence[tuple[str, str | None]]) -> dict[str | None, list[str]]:
    """Each node's own event sequence (the interleaving across nodes is up to the scheduler)."""
    grouped: dict[str | None, list[str]] = defaultdict(list)
    for kind, node in kinds_and_nodes:
        grouped[node].append(kind)
    return dict(grouped)


def as_emitted(events: Sequence[FlowEvent]) -> list[tuple[Any, ...]]:
    """What PenguiFlow emitted, in ``ts`` order (the order ``load_history`` promises)."""
    ordered = sorted(events, key=lambda event: event.ts)
    return [(e.event_type, e.node_name, e.node_id, e.ts, e.to_payload()) for e in ordered]


def as_stored(events: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [(e.kind, e.node_name, e.node_id, e.ts, dict(e.payload)) for e in events]


async def raw_history(raw: asyncpg.Connection, schema: str, trace_id: str) -> list[tuple[Any, ...]]:
    rows = await raw.fetch(
        f'SELECT kind, node_name, node_id, ts, payload FROM "{schema}".flow_events '
        "WHERE trace_id = $1 ORDER BY ts, id",
        trace_id,
    )
    return [(r["kind"], r["node_name"], r["node_id"], r["ts"], json.loads(r["payload"])) for r in rows]


async def test_every_runtime_event_is_the_stored_history_in_order(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    async with guarded_postgres(make_store) as store:
        audited = audited_flow(store)
        (ok, ok_result), (fatal, fatal_result) = await run_messages(audited.flow, ["hello", FATAL])
        assert ok_result == "HELLO!"
        assert isinstance(fatal_result, FlowError)
        assert fatal_result.code == FlowErrorCode.NODE_EXCEPTION

        for message, expected in ((ok, EXPECTED_BY_NODE["ok"]), (fatal, EXPECTED_BY_NODE[FATAL])):
            history = await store.load_history(message.trace_id)
            assert all(type(event) is StoredEvent for event in history)
            assert all(event.trace_id == message.trace_id for event in history)
            assert as_stored(history) == as_emitted(audited.emitted_for(message.trace_id))
            assert by_node([(event.kind, event.node_name) for event in history]) == expected
            first_start = [
                next(event.ts for event in history if event.node_name == node and event.kind == START)
                for node in NODE_NAMES
                if node in expected
            ]
            assert first_start == sorted(first_start)
            assert await audited.flow.load_history(message.trace_id) == history
            assert await raw_history(raw, schema_name, message.trace_id) == as_stored(history)

        fatal_history = await store.load_history(fatal.trace_id)
        errors = [event.payload for event in fatal_history if event.kind == ERROR]
        assert [payload["exception"] for payload in errors] == [
            "RuntimeError('enrich attempt 1 failed')",
            "RuntimeError('enrich attempt 2 failed')",
        ]
        assert all("flow_error" not in payload for payload in errors)
        (failed,) = [event.payload for event in fatal_history if event.kind == FAILED]
        assert failed["flow_error"]["code"] == "NODE_EXCEPTION"
        assert failed["flow_error"]["node_name"] == "enrich"


async def test_a_history_read_right_after_the_run_sees_every_batched_event(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    # Write-behind (the opt-in) with no timer flush: the events are acknowledged and still queued.
    held = GuardConfig(batching=BatchConfig(ack="enqueue", max_delay=60.0))
    async with guarded_postgres(make_store, config=held) as store:
        audited = audited_flow(store)
        ((message, result),) = await run_messages(audited.flow, ["hello"])
        assert result == "HELLO!"
        count = f'SELECT count(*) FROM "{schema_name}".flow_events WHERE trace_id = $1'
        assert await raw.fetchval(count, message.trace_id) == 0  # acknowledged, still queued

        history = await audited.flow.load_history(message.trace_id)  # PenguiFlow's own read API
        assert as_stored(history) == as_emitted(audited.emitted_for(message.trace_id))
        assert await raw.fetchval(count, message.trace_id) == len(history) == 9

        # PenguiFlow emits one ``node_cancelled`` per node worker, with trace_id None, when the flow
        # stops; the store files those under the global trace (spec 000 recommends "__global__").
        global_events = await store.load_history(GLOBAL_TRACE_ID)
        assert sorted((event.kind, event.node_name) for event in global_events) == [
            ("node_cancelled", node) for node in sorted(NODE_NAMES)
        ]
        assert all(event.trace_id == GLOBAL_TRACE_ID for event in global_events)
        assert controller(store).stats()[("save_event", "ok")] == len(audited.emitted)


async def test_readme_wiring(pg_dsn: str, schema_name: str) -> None:
    """The README's "Using with PenguiFlow" snippet, plus test-only pool and registry settings."""
    from penguiflow import Headers, Message, Node, create

    from guarded import guard
    from guarded.backends.postgres import PostgresStateStore
    from guarded.codec import penguiflow_types

    async def parse(message: Message, ctx: Any) -> Message:
        return message.model_copy(update={"payload": message.payload.strip()})

    async def answer(message: Message, ctx: Any) -> str:
        return f"echo: {message.payload}"

    parse_node, answer_node = Node(parse, name="parse"), Node(answer, name="answer")
    dsn = pg_dsn

    backend = await PostgresStateStore.connect(
        dsn,
        schema=schema_name,
        types=penguiflow_types(),  # reads return PenguiFlow's own classes
        pool=SMALL_POOL,
        registry=CollectorRegistry(),
        stats_interval=None,
    )
    async with guard(backend, name="agents", registry=CollectorRegistry()) as store:
        flow = create((parse_node, [answer_node]), (answer_node, []), state_store=store)
        flow.run()
        message = Message(payload=" hi ", headers=Headers(tenant="acme"))
        await flow.emit(message)
        result = await flow.fetch()
        await flow.stop()
        history = await flow.load_history(message.trace_id)

    assert result == "echo: hi"
    assert [(event.kind, event.node_name) for event in history] == [
        ("node_start", "parse"),
        ("node_success", "parse"),
        ("node_start", "answer"),
        ("node_success", "answer"),
    ]
    assert backend.pool.is_closing()  # leaving the block flushed and closed the backend
