"""Behind PgBouncer in transaction mode: what a call sends, and the statement timeout it keeps.

A statement the connection has run before goes out as one message flow (Parse, Bind, Execute,
Sync: one round trip), described by the server only the first time. Each operation runs in a
transaction that sets ``statement_timeout`` with ``SET LOCAL`` -- unless the server connections'
own default (here the database's) already cancels within the store's timeout, and then the call
is that one round trip. Either way a statement running past the timeout is cancelled by the
server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.statement_descriptions import send_parse_with_next_write
from guarded.pipeline.idempotency import idempotency_key
from guarded.testing.pgbouncer import PgBouncer

from ..conftest import StoreFactory

WAITING_MESSAGES = frozenset("QSH")
"""Messages after which the client waits for the server: a simple Query, a Sync, a Flush."""


class SentMessages:
    """The type of every protocol message the pool's connections send (installed as ``init``)."""

    def __init__(self) -> None:
        self.types: list[str] = []

    async def install(self, conn: asyncpg.Connection) -> None:
        transport: Any = conn._transport  # type: ignore[attr-defined]
        write: Callable[[bytes], None] = transport.write

        def counting_write(data: bytes) -> None:
            data = bytes(data)
            offset = 0
            while offset < len(data):
                self.types.append(chr(data[offset]))
                offset += 1 + int.from_bytes(data[offset + 1 : offset + 5], "big")
            write(data)

        transport.write = counting_write

    def round_trips(self) -> int:
        return sum(1 for kind in self.types if kind in WAITING_MESSAGES)


@pytest_asyncio.fixture
async def database_with_timeout(direct_dsn: str) -> AsyncIterator[str]:
    """A database whose sessions start with ``statement_timeout = 500ms`` (its name)."""
    name = f"timeout_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(direct_dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
        await conn.execute(f"ALTER DATABASE {name} SET statement_timeout = '500ms'")
    finally:
        await conn.close()
    yield name
    conn = await asyncpg.connect(direct_dsn)
    try:
        await conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        await conn.close()


def _through(bouncer: PgBouncer, database: str) -> str:
    return f"postgresql://{bouncer.user}@{bouncer.host}:{bouncer.port}/{database}"


async def _store(
    make_store: StoreFactory, sent: SentMessages, *, dsn: str | None = None, statement_timeout: float = 30.0
) -> PostgresStateStore:
    pool = PoolSettings(
        min_size=1, max_size=1, statement_timeout=statement_timeout, command_timeout=60.0, init=sent.install
    )
    options: dict[str, Any] = {"pool": pool}
    if dsn is not None:
        options["dsn"] = dsn
    return await make_store(**options)


async def _round_trips_of_a_call(store: PostgresStateStore, sent: SentMessages) -> int:
    await store.load_memory_state("k")  # described on first use
    sent.types.clear()
    assert await store.load_memory_state("k") == {"v": 1}
    return sent.round_trips()


async def _is_cancelled_by_the_server(store: PostgresStateStore) -> float:
    """Seconds until the server cancelled ``pg_sleep(20)`` (the client would wait 60 s)."""
    started = time.monotonic()
    with pytest.raises(asyncpg.QueryCanceledError, match="statement timeout"):
        await store._db.fetchval("SELECT pg_sleep(20)")
    return time.monotonic() - started


@pytest.mark.asyncio
async def test_a_statement_seen_before_is_one_message_flow_and_sets_its_timeout_per_transaction(
    make_store: StoreFactory,
) -> None:
    sent = SentMessages()
    store = await _store(make_store, sent)
    await store.save_memory_state("k", {"v": 1})
    # BEGIN; SET LOCAL -- Parse, Bind, Execute, Sync -- COMMIT; no Describe of its own.
    assert await _round_trips_of_a_call(store, sent) == 3
    assert "D" not in sent.types
    assert store._db.wraps_operations


@pytest.mark.asyncio
async def test_set_local_still_cancels_a_statement_past_the_timeout(make_store: StoreFactory) -> None:
    store = await _store(make_store, SentMessages(), statement_timeout=0.5)
    assert await _is_cancelled_by_the_server(store) < 15
    assert store._db.wraps_operations
    await store.save_memory_state("k", {"v": 1})  # the connection is usable afterwards
    assert await store.load_memory_state("k") == {"v": 1}


@pytest.mark.asyncio
async def test_a_database_default_within_the_timeout_makes_a_call_one_round_trip(
    make_store: StoreFactory, pg_bouncer: PgBouncer, database_with_timeout: str
) -> None:
    sent = SentMessages()
    dsn = _through(pg_bouncer, database_with_timeout)
    store = await _store(make_store, sent, dsn=dsn, statement_timeout=1.0)
    await store.save_memory_state("k", {"v": 1})
    assert not store._db.wraps_operations
    assert await _round_trips_of_a_call(store, sent) == 1
    assert await _is_cancelled_by_the_server(store) < 15


@pytest.mark.asyncio
async def test_a_database_default_longer_than_the_timeout_keeps_set_local(
    make_store: StoreFactory, pg_bouncer: PgBouncer, database_with_timeout: str
) -> None:
    sent = SentMessages()
    dsn = _through(pg_bouncer, database_with_timeout)
    store = await _store(make_store, sent, dsn=dsn, statement_timeout=0.2)
    await store.save_memory_state("k", {"v": 1})
    assert store._db.wraps_operations
    assert await _round_trips_of_a_call(store, sent) == 3
    assert await _is_cancelled_by_the_server(store) < 15


@pytest.mark.asyncio
async def test_a_changed_schema_state_drops_the_kept_descriptions(make_store: StoreFactory) -> None:
    sent = SentMessages()
    store = await _store(make_store, sent)
    await store.save_memory_state("k", {"v": 1})
    await _round_trips_of_a_call(store, sent)
    async with store.pool.acquire() as conn:
        await conn.reload_schema_state()
    sent.types.clear()
    assert await store.load_memory_state("k") == {"v": 1}
    assert "D" in sent.types  # described again


class RecordingTransport:
    """Records each write as the socket would get it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + (4 + len(body)).to_bytes(4, "big") + body


@pytest.mark.asyncio
async def test_a_lone_parse_goes_out_with_the_next_write() -> None:
    transport = RecordingTransport()
    send_parse_with_next_write(transport, asyncio.get_running_loop())
    parse = _message(b"P", b"\x00SELECT 1\x00\x00\x00")
    bind_execute_sync = _message(b"B", b"\x00\x00") + _message(b"E", b"\x00\x00\x00\x00\x00") + _message(b"S")
    transport.write(parse)
    assert transport.writes == []
    transport.write(bind_execute_sync)
    assert transport.writes == [parse + bind_execute_sync]
    # Parse with Describe and Flush is not held; a lone Parse with nothing after goes out at the
    # loop's next turn.
    describe = parse + _message(b"D", b"S\x00") + _message(b"H")
    transport.write(describe)
    assert transport.writes[-1] == describe
    transport.write(parse)
    await asyncio.sleep(0)
    assert transport.writes[-1] == parse


@pytest.mark.asyncio
async def test_a_consume_of_two_statements_keeps_one_transaction_when_the_server_sets_the_timeout(
    make_store: StoreFactory, pg_bouncer: PgBouncer, database_with_timeout: str
) -> None:
    sent = SentMessages()
    dsn = _through(pg_bouncer, database_with_timeout)
    store = await _store(make_store, sent, dsn=dsn, statement_timeout=1.0)
    await store.save_planner_state("token", {"v": 1})
    assert not store._db.wraps_operations
    with idempotency_key("consumer"):
        assert await store.load_planner_state("token") == {"v": 1}
        sent.types.clear()
        # Consumed by this key already: the mark finds nothing, the repeat check answers.
        assert await store.load_planner_state("token") == {"v": 1}
    # BEGIN, the mark, the repeat check, COMMIT: one transaction, so one server connection.
    assert sent.types.count("Q") == 2
    assert sent.types[0] == "Q"
    assert sent.types[-1] == "Q"
    assert sent.types.count("E") == 2
