"""The bytea artifact store and ArtifactRetentionConfig: TTL, size and count limits, LRU/FIFO/none."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from guarded.backends.postgres import (
    ArtifactLimitError,
    ArtifactTooLargeError,
    PostgresArtifactStore,
    PostgresStateStore,
)
from guarded.models import ArtifactRetentionConfig, ArtifactScope

from .conftest import StoreFactory


async def artifacts_with(make_store: StoreFactory, **limits: Any) -> PostgresArtifactStore:
    store = await make_store(artifact_retention=ArtifactRetentionConfig(**limits))
    return store.artifact_store


def in_session(session: str | None, trace: str | None = None, **more: Any) -> ArtifactScope:
    return ArtifactScope(session_id=session, trace_id=trace, **more)


async def ids(artifacts: PostgresArtifactStore, **scope: Any) -> list[str]:
    return [ref.id for ref in await artifacts.list(scope=ArtifactScope(**scope) if scope else None)]


@pytest.mark.asyncio
async def test_same_content_and_namespace_return_the_stored_ref(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    artifacts = store.artifact_store
    first = await artifacts.put_bytes(b"payload", namespace="tool.x", filename="a.bin", scope=in_session("s"))
    assert first.id.startswith("tool_x_")
    assert first.size_bytes == 7
    before = await raw.fetchval(f'SELECT expires_at FROM "{store.schema}".artifacts')
    again = await artifacts.put_bytes(b"payload", namespace="tool.x", filename="other.bin")
    assert again == first  # the stored ref, not the new metadata
    after = await raw.fetchval(f'SELECT expires_at FROM "{store.schema}".artifacts')
    assert after > before  # the TTL restarted
    other_namespace = await artifacts.put_bytes(b"payload", namespace="other")
    assert other_namespace.id != first.id


@pytest.mark.asyncio
async def test_expired_artifacts_are_invisible_and_cleaned_up(
    store: PostgresStateStore, raw: asyncpg.Connection
) -> None:
    artifacts = store.artifact_store
    ref = await artifacts.put_text("soon gone", scope=in_session("s"))
    kept = await artifacts.put_text("kept", scope=in_session("s"))
    await raw.execute(
        f"UPDATE \"{store.schema}\".artifacts SET expires_at = now() - interval '1 second' "
        "WHERE artifact_id = $1",
        ref.id,
    )
    assert await artifacts.get(ref.id) is None
    assert await artifacts.get_ref(ref.id) is None
    assert await artifacts.exists(ref.id) is False
    assert await ids(artifacts) == [kept.id]
    assert await artifacts.delete(ref.id) is False
    assert (await store.cleanup()).deleted["artifacts"] == 0  # delete() already removed the expired row
    await raw.execute(f"UPDATE \"{store.schema}\".artifacts SET expires_at = now() - interval '1 second'")
    assert (await store.cleanup()).deleted["artifacts"] == 1
    assert await raw.fetchval(f'SELECT count(*) FROM "{store.schema}".artifacts') == 0


@pytest.mark.asyncio
async def test_ttl_zero_never_expires(make_store: StoreFactory, raw: asyncpg.Connection) -> None:
    artifacts = await artifacts_with(make_store, ttl_seconds=0)
    await artifacts.put_bytes(b"forever")
    assert await raw.fetchval(f'SELECT expires_at FROM "{artifacts._schema}".artifacts') is None


@pytest.mark.asyncio
async def test_too_large_is_refused_before_io(make_store: StoreFactory) -> None:
    artifacts = await artifacts_with(make_store, max_artifact_bytes=4)
    with pytest.raises(ArtifactTooLargeError):
        await artifacts.put_bytes(b"12345")
    await artifacts.put_bytes(b"1234")


@pytest.mark.asyncio
@pytest.mark.parametrize(("strategy", "evicted"), [("lru", "b"), ("fifo", "a")])
async def test_count_limit_evicts_by_strategy(make_store: StoreFactory, strategy: str, evicted: str) -> None:
    artifacts = await artifacts_with(make_store, max_artifacts_per_session=2, cleanup_strategy=strategy)
    refs = {name: await artifacts.put_bytes(name.encode(), scope=in_session("s")) for name in ("a", "b")}
    assert await artifacts.get(refs["a"].id) == b"a"  # a is now the most recently used
    refs["c"] = await artifacts.put_bytes(b"c", scope=in_session("s"))
    remaining = {name for name, ref in refs.items() if await artifacts.exists(ref.id)}
    assert remaining == {"a", "b", "c"} - {evicted}
    # Other sessions are other groups.
    await artifacts.put_bytes(b"d", scope=in_session("other"))
    assert len(await ids(artifacts, session_id="s")) == 2


@pytest.mark.asyncio
async def test_strategy_none_refuses_and_evicts_nothing(make_store: StoreFactory) -> None:
    artifacts = await artifacts_with(make_store, max_artifacts_per_trace=1, cleanup_strategy="none")
    first = await artifacts.put_bytes(b"first", scope=in_session("s", "trace"))
    with pytest.raises(ArtifactLimitError) as caught:
        await artifacts.put_bytes(b"second", scope=in_session("s", "trace"))
    assert caught.value.limit == "max_artifacts_per_trace"
    assert await artifacts.exists(first.id)
    await artifacts.put_bytes(b"another trace", scope=in_session("s", "trace-2"))


@pytest.mark.asyncio
async def test_byte_limits(make_store: StoreFactory) -> None:
    artifacts = await artifacts_with(make_store, max_session_bytes=10, max_trace_bytes=8)
    with pytest.raises(ArtifactLimitError) as caught:
        await artifacts.put_bytes(b"x" * 11, scope=in_session("s"))
    assert caught.value.limit == "max_session_bytes"
    a = await artifacts.put_bytes(b"a" * 6, scope=in_session("s"))
    b = await artifacts.put_bytes(b"b" * 4, scope=in_session("s"))
    c = await artifacts.put_bytes(b"c" * 3, scope=in_session("s"))  # 13 > 10: evict a
    assert [await artifacts.exists(ref.id) for ref in (a, b, c)] == [False, True, True]
    t1 = await artifacts.put_bytes(b"1" * 5, scope=in_session("u", "t"))
    t2 = await artifacts.put_bytes(b"2" * 5, scope=in_session("u", "t"))  # 10 > 8 for the trace
    assert [await artifacts.exists(ref.id) for ref in (t1, t2)] == [False, True]


@pytest.mark.asyncio
async def test_unscoped_artifacts_form_their_own_group(make_store: StoreFactory) -> None:
    artifacts = await artifacts_with(make_store, max_artifacts_per_session=2)
    for index in range(4):
        await artifacts.put_bytes(f"unscoped {index}".encode())
    await artifacts.put_bytes(b"scoped", scope=in_session("s"))
    assert len(await ids(artifacts)) == 3


@pytest.mark.asyncio
async def test_concurrent_puts_never_overshoot_a_limit(make_store: StoreFactory) -> None:
    first = await artifacts_with(make_store, max_artifacts_per_session=3)
    second = (
        await make_store(artifact_retention=ArtifactRetentionConfig(max_artifacts_per_session=3))
    ).artifact_store
    await asyncio.gather(
        *(
            (first if index % 2 else second).put_bytes(f"item {index}".encode(), scope=in_session("busy"))
            for index in range(20)
        )
    )
    assert len(await ids(first, session_id="busy")) == 3


@pytest.mark.asyncio
async def test_list_filters_by_every_scope_field(store: PostgresStateStore) -> None:
    artifacts = store.artifact_store
    mine = await artifacts.put_bytes(b"mine", scope=in_session("s", tenant_id="t1", user_id="u1"))
    theirs = await artifacts.put_bytes(b"theirs", scope=in_session("s", tenant_id="t2", user_id="u1"))
    await artifacts.put_bytes(b"elsewhere", scope=in_session("x", tenant_id="t1"))
    assert await ids(artifacts, session_id="s") == [mine.id, theirs.id]
    assert await ids(artifacts, session_id="s", tenant_id="t1") == [mine.id]
    assert await ids(artifacts, user_id="u1") == [mine.id, theirs.id]
    assert await ids(artifacts, session_id="nobody") == []


@pytest.mark.asyncio
async def test_text_roundtrip_and_delete(store: PostgresStateStore) -> None:
    artifacts = store.artifact_store
    ref = await artifacts.put_text("héllo\x00 wörld", filename="x.txt", meta={"tool": "t"})
    assert ref.mime_type == "text/plain"
    assert ref.source == {"tool": "t"}
    assert await artifacts.get(ref.id) == "héllo\x00 wörld".encode()
    assert await artifacts.get_ref(ref.id) == ref
    assert await artifacts.delete(ref.id) is True
    assert await artifacts.delete(ref.id) is False
