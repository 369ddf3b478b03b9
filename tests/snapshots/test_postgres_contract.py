"""The SnapshotStore contract suite on PostgreSQL (real embedded server, a fresh schema per test),
plus what only a database backend has: the migration's tables, sharing a state store's pool, blobs
stored once and streamed in chunks."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.postgres import PostgresSnapshotStore
from guarded.snapshots import (
    FORMAT_VERSION,
    SECTIONS,
    FormatTooNewError,
    MigrationRegistry,
    MissingMigrationError,
    SnapshotCorruptError,
    records,
)
from guarded.testing.pytest_snapshot_contract import SnapshotStoreContract
from guarded.testing.snapshot_contract import make_content, run_snapshot_contracts
from tests.postgres.conftest import SMALL_POOL, StoreFactory


@pytest_asyncio.fixture
async def snapshot_store(pg_dsn: str, schema_name: str) -> AsyncIterator[PostgresSnapshotStore]:
    store = await PostgresSnapshotStore.connect(pg_dsn, schema=schema_name, pool=SMALL_POOL)
    yield store
    await store.close()


class TestPostgresSnapshotStore(SnapshotStoreContract):
    pass


@pytest.mark.asyncio
async def test_runner_passes_on_postgres(pg_dsn: str) -> None:
    opened: list[PostgresSnapshotStore] = []

    async def fresh() -> PostgresSnapshotStore:
        store = await PostgresSnapshotStore.connect(
            pg_dsn, schema=f"t_{uuid.uuid4().hex[:16]}", pool=SMALL_POOL
        )
        opened.append(store)
        return store

    try:
        report = await run_snapshot_contracts(fresh)
    finally:
        for store in opened:
            await store.close()
    assert report.ok, str(report)


@pytest.mark.asyncio
async def test_shares_a_state_store_pool_and_schema(make_store: StoreFactory, schema_name: str) -> None:
    state = await make_store()
    snapshots = PostgresSnapshotStore.of(state)
    assert snapshots.schema == schema_name
    content = await make_content("s-of")
    try:
        saved = await snapshots.save(content)
    finally:
        await content.aclose()
    assert (await snapshots.get(saved.id)) == saved
    await snapshots.close()  # leaves the state store's pool alone
    assert await state.load_memory_state("nope") is None


@pytest.mark.asyncio
async def test_blobs_are_stored_once_in_chunks(
    snapshot_store: PostgresSnapshotStore, pg_dsn: str, schema_name: str
) -> None:
    big = bytes(range(256)) * 9000  # 2.2 MiB: three chunks
    for index in range(3):
        content = await make_content("s-blob", blobs=(big,), snapshot_id=f"blob-{index}")
        try:
            await snapshot_store.save(content)
        finally:
            await content.aclose()
    conn = await asyncpg.connect(pg_dsn)
    try:
        blobs = await conn.fetch(f'SELECT size, chunks FROM "{schema_name}".snapshot_blobs')
        refs = await conn.fetchval(f'SELECT count(*) FROM "{schema_name}".snapshot_blob_refs')
    finally:
        await conn.close()
    assert [(row["size"], row["chunks"]) for row in blobs] == [(len(big), 3)]
    assert refs == 3
    async with await snapshot_store.load("blob-2") as loaded:
        found = [await loaded.read_blob(str(r["blob"])) async for r in records(loaded, "artifacts")]
    assert found == [big]


@pytest.mark.asyncio
async def test_a_corrupt_blob_is_refused_and_rolls_back(snapshot_store: PostgresSnapshotStore) -> None:
    content = await make_content("s-bad", blobs=(b"real",))
    try:
        blob = next(iter((content.directory / "blobs").iterdir()))
        blob.write_bytes(b"forged")
        with pytest.raises(SnapshotCorruptError, match=r"does not match its (hash|size)"):
            await snapshot_store.save(content)
    finally:
        await content.aclose()
    assert (await snapshot_store.list(subject_id="s-bad")).items == ()
    assert (await snapshot_store.gc()).blobs_kept == 0


@pytest.mark.asyncio
async def test_gc_waits_for_a_save_in_progress(
    snapshot_store: PostgresSnapshotStore, pg_dsn: str, schema_name: str
) -> None:
    """A save holds the snapshot lock shared for its transaction: gc waits, then keeps its blob."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        from backends.postgres.snapshots import snapshot_lock_key

        await conn.execute("BEGIN")
        await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", snapshot_lock_key(schema_name))
        gc = asyncio.ensure_future(snapshot_store.gc())
        await asyncio.sleep(0.3)
        assert not gc.done()
        await conn.execute("COMMIT")
        report = await asyncio.wait_for(gc, 10)
    finally:
        await conn.close()
    assert report.blobs_deleted == 0


async def _write_v1(conn: asyncpg.Connection, schema: str, content: object, **changes: object) -> str:
    """Store ``content`` as format 1 rows, as older code would have (its blobs already stored)."""
    from guarded.snapshots.content import canonical, parse_line
    from guarded.snapshots.migrations import V1_SECTIONS

    snapshot = content.snapshot  # type: ignore[attr-defined]

    async def lines(section: str) -> list[bytes]:
        return [line async for batch in content.lines(section) for line in batch]  # type: ignore[attr-defined]

    sections: dict[str, list[bytes]] = {}
    for name in V1_SECTIONS:
        if name == "session_log":
            sections[name] = [
                canonical({"type": kind, "record": parse_line(line)})
                for kind, section in (("update", "updates"), ("steering", "steering"))
                for line in await lines(section)
            ]
        else:
            sections[name] = await lines(name)
    batches = {name: 1 if found else 0 for name, found in sections.items()}
    manifest = {
        "format_version": 1,
        "id": snapshot.id,
        "subject": f"{snapshot.subject_kind}:{snapshot.subject_id}",
        "created_at": snapshot.created_at.isoformat(),
        "tags": list(snapshot.tags),
        "description": "from v1",
        "parent_id": None,
        **changes,
    }
    await conn.execute(
        f'INSERT INTO "{schema}".snapshots (id, subject_kind, subject_id, created_at, format_version, '
        "tags, content_hash, manifest, batches) VALUES ($1, $2, $3, $4, $5, $6, '', $7, $8)",
        snapshot.id,
        snapshot.subject_kind,
        snapshot.subject_id,
        snapshot.created_at,
        manifest["format_version"],
        list(snapshot.tags),
        json.dumps(manifest),
        json.dumps(batches),
    )
    for name, found in sections.items():
        if found:
            await conn.execute(
                f'INSERT INTO "{schema}".snapshot_lines VALUES ($1, $2, 0, $3, $4)',
                snapshot.id,
                name,
                len(found),
                b"\n".join(found),
            )
    return str(snapshot.id)


@pytest.mark.asyncio
async def test_old_formats_migrate_and_too_new_ones_fail_loudly(
    snapshot_store: PostgresSnapshotStore, pg_dsn: str, schema_name: str
) -> None:
    content = await make_content("s-v1", blobs=(b"kept",), snapshot_id="v1-snap")
    conn = await asyncpg.connect(pg_dsn)
    try:
        expected = {name: [ln async for batch in content.lines(name) for ln in batch] for name in SECTIONS}
        saved = await snapshot_store.save(content)
        await snapshot_store.delete(saved.id)  # its blob stays until gc
        await _write_v1(conn, schema_name, content)
        future = await make_content("s-v9", snapshot_id="v9-snap")
        await _write_v1(conn, schema_name, future, format_version=9)
        await future.aclose()
    finally:
        await content.aclose()
        await conn.close()
    assert (await snapshot_store.get("v1-snap")).format_version == 1
    async with await snapshot_store.load("v1-snap") as loaded:
        assert loaded.snapshot.format_version == FORMAT_VERSION
        assert loaded.snapshot.content_hash == saved.content_hash
        got = {name: [line async for batch in loaded.lines(name) for line in batch] for name in SECTIONS}
        assert got == expected
        blobs = [await loaded.read_blob(str(r["blob"])) async for r in records(loaded, "artifacts")]
        assert blobs == [b"kept"]
    with pytest.raises(FormatTooNewError, match="format version 9 is newer than this code's 2"):
        await snapshot_store.load("v9-snap")
    missing = PostgresSnapshotStore.of(snapshot_store, migrations=MigrationRegistry())
    with pytest.raises(MissingMigrationError):
        await missing.load("v1-snap")


@pytest.mark.asyncio
async def test_ids_of_one_instant_list_in_code_point_order(
    snapshot_store: PostgresSnapshotStore, tmp_path: object
) -> None:
    """The file backend sorts ids as Python does (code points); so does PostgreSQL. The embedded
    server's databases collate as C already; the ``snapshots.id`` column's ``COLLATE "C"`` keeps that
    order on a database whose collation is a language's (``en_US``: ``a-1`` before ``B-2``)."""
    from datetime import UTC, datetime

    when = datetime(2026, 2, 1, tzinfo=UTC)
    ids = ["a-1", "B-2", "c_", "Z9", "a-10", "a.1"]
    for snapshot_id in ids:
        content = await make_content("s-order", snapshot_id=snapshot_id, created_at=when)
        try:
            await snapshot_store.save(content)
        finally:
            await content.aclose()
    seen: list[str] = []
    cursor = None
    while True:
        page = await snapshot_store.list(subject_id="s-order", limit=2, cursor=cursor)
        seen += [s.id for s in page.items]
        if (cursor := page.next_cursor) is None:
            break
    assert seen == sorted(ids)
