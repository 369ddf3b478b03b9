"""The in-memory artifact store and every ArtifactRetentionConfig rule (spec 000 "Artifact Store")."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from guarded.backends.memory_artifacts import (
    ArtifactLimitError,
    ArtifactTooLargeError,
    InMemoryArtifactStore,
    artifact_id,
    sanitize_artifact_namespace,
)
from guarded.errors import InvalidPayloadError
from guarded.models import ArtifactRetentionConfig, ArtifactScope, ArtifactStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock | None = None, **limits: Any) -> InMemoryArtifactStore:
    return InMemoryArtifactStore(ArtifactRetentionConfig(**limits), clock=clock or Clock())


def session(session_id: str | None, trace_id: str | None = None) -> ArtifactScope:
    return ArtifactScope(session_id=session_id, trace_id=trace_id)


async def ids(store: InMemoryArtifactStore) -> list[str]:
    return [ref.id for ref in await store.list()]


def test_implements_the_protocol() -> None:
    assert isinstance(InMemoryArtifactStore(), ArtifactStore)


class TestBasics:
    @pytest.mark.asyncio
    async def test_put_bytes_returns_a_complete_ref(self) -> None:
        store = make()
        scope = ArtifactScope(tenant_id="t", user_id="u", session_id="s", trace_id="tr")
        ref = await store.put_bytes(
            b"%PDF",
            mime_type="application/pdf",
            filename="a.pdf",
            namespace="pdf",
            scope=scope,
            meta={"k": [1]},
        )
        digest = hashlib.sha256(b"%PDF").hexdigest()
        assert ref.id == f"pdf_{digest[:12]}"
        assert (ref.mime_type, ref.size_bytes, ref.filename, ref.sha256) == (
            "application/pdf",
            4,
            "a.pdf",
            digest,
        )
        assert (ref.scope, ref.namespace, ref.source) == (scope, "pdf", {"k": [1]})
        assert await store.get(ref.id) == b"%PDF"
        assert await store.get_ref(ref.id) == ref
        assert await store.exists(ref.id)

    @pytest.mark.parametrize(
        ("namespace", "prefix"),
        [(None, "art"), ("tool", "tool"), ("my tool/v1", "my_tool_v1"), ("///", "art"), ("-a.b-", "a_b")],
    )
    def test_ids_follow_penguiflow(self, namespace: str | None, prefix: str) -> None:
        assert artifact_id(b"x", namespace) == f"{prefix}_{hashlib.sha256(b'x').hexdigest()[:12]}"

    def test_namespace_sanitization(self) -> None:
        assert sanitize_artifact_namespace(None) is None
        assert sanitize_artifact_namespace("__") is None
        assert sanitize_artifact_namespace("a b") == "a_b"

    @pytest.mark.asyncio
    async def test_identical_content_and_namespace_dedups(self) -> None:
        store = make()
        first = await store.put_bytes(b"same", namespace="n", filename="one")
        second = await store.put_bytes(b"same", namespace="n", filename="two")
        other = await store.put_bytes(b"same", namespace="m")
        assert second == first
        assert second.filename == "one"
        assert other.id != first.id
        assert store.count == 2

    @pytest.mark.asyncio
    async def test_put_text_stores_utf8(self) -> None:
        store = make()
        ref = await store.put_text("héllo", namespace="t")
        assert ref.mime_type == "text/plain"
        assert ref.size_bytes == 6
        assert await store.get(ref.id) == "héllo".encode()

    @pytest.mark.asyncio
    async def test_bytearray_and_memoryview_are_accepted(self) -> None:
        store = make()
        ref = await store.put_bytes(bytearray(b"ab"))  # type: ignore[arg-type]
        assert await store.get(ref.id) == b"ab"
        assert (await store.put_bytes(memoryview(b"ab"))).id == ref.id  # type: ignore[arg-type]

    @pytest.mark.asyncio
    async def test_missing_artifacts(self) -> None:
        store = make()
        assert await store.get("nope") is None
        assert await store.get_ref("nope") is None
        assert not await store.exists("nope")
        assert not await store.delete("nope")

    @pytest.mark.asyncio
    async def test_delete(self) -> None:
        store = make()
        ref = await store.put_bytes(b"gone")
        assert await store.delete(ref.id)
        assert not await store.delete(ref.id)
        assert await store.get(ref.id) is None
        assert store.count == 0


class TestRefusals:
    @pytest.mark.asyncio
    async def test_lone_surrogate_text_is_invalid_and_nothing_is_stored(self) -> None:
        store = make()
        with pytest.raises(InvalidPayloadError) as caught:
            await store.put_text("bad \ud800")
        assert caught.value.path == "text"
        assert store.count == 0

    @pytest.mark.asyncio
    async def test_non_json_meta_is_invalid_and_nothing_is_stored(self) -> None:
        store = make()
        with pytest.raises(InvalidPayloadError) as caught:
            await store.put_bytes(b"x", meta={"when": object()})
        assert caught.value.path == "meta[key #0 (str)]"
        with pytest.raises(InvalidPayloadError):
            await store.put_bytes(b"x", meta={"n": float("nan")})
        assert store.count == 0

    @pytest.mark.asyncio
    async def test_bad_filename_and_non_bytes_are_invalid(self) -> None:
        store = make()
        with pytest.raises(InvalidPayloadError):
            await store.put_bytes(b"x", filename="\udc00")
        with pytest.raises(InvalidPayloadError):
            await store.put_bytes("text")  # type: ignore[arg-type]
        with pytest.raises(InvalidPayloadError):
            await store.put_text(b"bytes")  # type: ignore[arg-type]
        assert store.count == 0

    @pytest.mark.asyncio
    async def test_max_artifact_bytes(self) -> None:
        store = make(max_artifact_bytes=4)
        await store.put_bytes(b"1234")
        with pytest.raises(ArtifactTooLargeError, match="max_artifact_bytes=4") as caught:
            await store.put_bytes(b"12345")
        assert isinstance(caught.value, ValueError)
        assert store.count == 1


class TestIsolation:
    @pytest.mark.asyncio
    async def test_returned_refs_are_fresh_copies(self) -> None:
        store = make()
        meta: dict[str, Any] = {"tags": ["a"]}
        ref = await store.put_bytes(b"x", meta=meta)
        meta["tags"].append("caller")
        ref.source["tags"].append("returned")
        stored = await store.get_ref(ref.id)
        assert stored is not None
        assert stored.source == {"tags": ["a"]}
        stored.source.clear()
        assert (await store.list())[0].source == {"tags": ["a"]}


class TestTtl:
    @pytest.mark.asyncio
    async def test_expired_artifacts_are_invisible_and_purged(self) -> None:
        clock = Clock()
        store = make(clock, ttl_seconds=60)
        ref = await store.put_bytes(b"old")
        clock.now += 60
        assert await store.exists(ref.id)
        clock.now += 1
        assert await store.get(ref.id) is None
        assert await store.get_ref(ref.id) is None
        assert not await store.exists(ref.id)
        assert await store.list() == []
        assert not await store.delete(ref.id)
        assert store.count == 0
        assert store.expired == 1

    @pytest.mark.asyncio
    async def test_list_purges_every_expired_artifact(self) -> None:
        clock = Clock()
        store = make(clock, ttl_seconds=10)
        await store.put_bytes(b"a")
        await store.put_bytes(b"b")
        clock.now += 5
        fresh = await store.put_bytes(b"c")
        clock.now += 6
        assert await ids(store) == [fresh.id]
        assert store.expired == 2
        assert store.count == 1

    @pytest.mark.asyncio
    async def test_putting_the_same_content_again_restarts_the_ttl(self) -> None:
        clock = Clock()
        store = make(clock, ttl_seconds=10)
        ref = await store.put_bytes(b"keep")
        clock.now += 8
        await store.put_bytes(b"keep")
        clock.now += 8
        assert await store.get(ref.id) == b"keep"

    @pytest.mark.asyncio
    async def test_an_expired_artifact_can_be_put_again(self) -> None:
        clock = Clock()
        store = make(clock, ttl_seconds=10)
        ref = await store.put_bytes(b"again")
        clock.now += 11
        assert (await store.put_bytes(b"again")).id == ref.id
        assert await store.get(ref.id) == b"again"

    @pytest.mark.parametrize("ttl", [0, -1])
    @pytest.mark.asyncio
    async def test_non_positive_ttl_never_expires(self, ttl: int) -> None:
        clock = Clock()
        store = make(clock, ttl_seconds=ttl)
        ref = await store.put_bytes(b"forever")
        clock.now += 10**9
        assert await store.get(ref.id) == b"forever"


class TestEviction:
    @pytest.mark.asyncio
    async def test_lru_evicts_the_least_recently_used(self) -> None:
        store = make(max_artifacts_per_session=2, cleanup_strategy="lru")
        a = await store.put_bytes(b"a", scope=session("s"))
        await store.put_bytes(b"b", scope=session("s"))
        await store.get(a.id)
        c = await store.put_bytes(b"c", scope=session("s"))
        assert await ids(store) == [a.id, c.id]
        assert store.evicted == 1

    @pytest.mark.asyncio
    async def test_lru_counts_a_repeated_put_as_use(self) -> None:
        store = make(max_artifacts_per_session=2, cleanup_strategy="lru")
        a = await store.put_bytes(b"a", scope=session("s"))
        b = await store.put_bytes(b"b", scope=session("s"))
        await store.put_bytes(b"a", scope=session("s"))
        await store.put_bytes(b"c", scope=session("s"))
        assert a.id in await ids(store)
        assert b.id not in await ids(store)

    @pytest.mark.asyncio
    async def test_get_ref_and_exists_do_not_count_as_use(self) -> None:
        store = make(max_artifacts_per_session=2, cleanup_strategy="lru")
        a = await store.put_bytes(b"a", scope=session("s"))
        await store.put_bytes(b"b", scope=session("s"))
        await store.get_ref(a.id)
        await store.exists(a.id)
        await store.put_bytes(b"c", scope=session("s"))
        assert a.id not in await ids(store)

    @pytest.mark.asyncio
    async def test_fifo_evicts_the_oldest_inserted_despite_use(self) -> None:
        store = make(max_artifacts_per_session=2, cleanup_strategy="fifo")
        a = await store.put_bytes(b"a", scope=session("s"))
        b = await store.put_bytes(b"b", scope=session("s"))
        await store.get(a.id)
        c = await store.put_bytes(b"c", scope=session("s"))
        assert await ids(store) == [b.id, c.id]

    @pytest.mark.asyncio
    async def test_session_bytes_evict_as_many_as_needed(self) -> None:
        store = make(max_session_bytes=10, cleanup_strategy="fifo")
        for chunk in (b"1111", b"2222", b"33"):
            await store.put_bytes(chunk, scope=session("s"))
        big = await store.put_bytes(b"44444444", scope=session("s"))
        assert await ids(store) == [artifact_id(b"33"), big.id]
        assert store.evicted == 2
        assert store.total_bytes == 10

    @pytest.mark.asyncio
    async def test_trace_count_limit(self) -> None:
        store = make(max_artifacts_per_trace=1)
        await store.put_bytes(b"a", scope=session("s", "t1"))
        other = await store.put_bytes(b"b", scope=session("s", "t2"))
        newest = await store.put_bytes(b"c", scope=session("s", "t1"))
        assert await ids(store) == [other.id, newest.id]

    @pytest.mark.asyncio
    async def test_trace_bytes_limit(self) -> None:
        store = make(max_trace_bytes=5)
        await store.put_bytes(b"aaa", scope=session("s", "t"))
        kept = await store.put_bytes(b"bbb", scope=session("s", "u"))
        newest = await store.put_bytes(b"ccc", scope=session("s", "t"))
        assert await ids(store) == [kept.id, newest.id]

    @pytest.mark.asyncio
    async def test_limits_apply_per_session(self) -> None:
        store = make(max_artifacts_per_session=1)
        await store.put_bytes(b"a", scope=session("s1"))
        await store.put_bytes(b"b", scope=session("s2"))
        assert store.count == 2
        assert store.evicted == 0

    @pytest.mark.asyncio
    async def test_unscoped_artifacts_form_one_group(self) -> None:
        store = make(max_artifacts_per_session=2)
        await store.put_bytes(b"a")
        await store.put_bytes(b"b", scope=ArtifactScope(tenant_id="t"))
        await store.put_bytes(b"c", scope=session("s"))
        await store.put_bytes(b"d")
        assert await ids(store) == [artifact_id(x) for x in (b"b", b"c", b"d")]

    @pytest.mark.asyncio
    async def test_an_artifact_larger_than_a_group_limit_is_refused_without_evicting(self) -> None:
        store = make(max_session_bytes=5)
        await store.put_bytes(b"abc", scope=session("s"))
        with pytest.raises(ArtifactLimitError, match="max_session_bytes=5") as caught:
            await store.put_bytes(b"123456", scope=session("s"))
        assert caught.value.limit == "max_session_bytes"
        assert store.count == 1
        assert store.evicted == 0

    @pytest.mark.asyncio
    async def test_non_positive_limits_are_disabled(self) -> None:
        store = make(
            max_artifact_bytes=0,
            max_session_bytes=0,
            max_trace_bytes=-1,
            max_artifacts_per_session=0,
            max_artifacts_per_trace=0,
        )
        for index in range(5):
            await store.put_bytes(bytes([index]) * 100, scope=session("s", "t"))
        assert store.count == 5


class TestStrategyNone:
    @pytest.mark.parametrize(
        ("limits", "field"),
        [
            ({"max_artifacts_per_session": 1}, "max_artifacts_per_session"),
            ({"max_session_bytes": 4}, "max_session_bytes"),
            ({"max_artifacts_per_trace": 1}, "max_artifacts_per_trace"),
            ({"max_trace_bytes": 4}, "max_trace_bytes"),
        ],
    )
    @pytest.mark.asyncio
    async def test_a_full_group_refuses_the_put_naming_the_limit(
        self, limits: dict[str, Any], field: str
    ) -> None:
        store = make(cleanup_strategy="none", **limits)
        first = await store.put_bytes(b"abc", scope=session("s", "t"))
        with pytest.raises(ArtifactLimitError, match=f"{field}=.*cleanup_strategy is 'none'") as caught:
            await store.put_bytes(b"xyz", scope=session("s", "t"))
        assert caught.value.limit == field
        assert isinstance(caught.value, ValueError)
        assert await ids(store) == [first.id]
        assert store.evicted == 0

    @pytest.mark.asyncio
    async def test_a_repeated_put_of_stored_content_is_not_refused(self) -> None:
        store = make(cleanup_strategy="none", max_artifacts_per_session=1)
        ref = await store.put_bytes(b"abc", scope=session("s"))
        assert await store.put_bytes(b"abc", scope=session("s")) == ref

    @pytest.mark.asyncio
    async def test_room_freed_by_delete_is_usable(self) -> None:
        store = make(cleanup_strategy="none", max_artifacts_per_session=1)
        ref = await store.put_bytes(b"abc", scope=session("s"))
        await store.delete(ref.id)
        await store.put_bytes(b"xyz", scope=session("s"))
        assert store.count == 1


class TestListing:
    @pytest.mark.asyncio
    async def test_scope_filter(self) -> None:
        store = make()
        a = await store.put_bytes(b"a", scope=ArtifactScope(tenant_id="t1", session_id="s1", trace_id="x"))
        b = await store.put_bytes(b"b", scope=ArtifactScope(tenant_id="t1", session_id="s2"))
        c = await store.put_bytes(b"c")
        assert await ids(store) == [a.id, b.id, c.id]
        assert [r.id for r in await store.list(scope=ArtifactScope(tenant_id="t1"))] == [a.id, b.id]
        assert [r.id for r in await store.list(scope=ArtifactScope(session_id="s2"))] == [b.id]
        assert [r.id for r in await store.list(scope=ArtifactScope(trace_id="x"))] == [a.id]
        assert [r.id for r in await store.list(scope=ArtifactScope())] == [a.id, b.id, c.id]

    @pytest.mark.asyncio
    async def test_clear_session_and_clear(self) -> None:
        store = make()
        await store.put_bytes(b"a", scope=session("s1"))
        b = await store.put_bytes(b"b", scope=session("s2"))
        store.clear_session("s1")
        assert await ids(store) == [b.id]
        store.clear()
        assert store.count == 0
        assert store.total_bytes == 0


@pytest.mark.asyncio
async def test_concurrent_puts_lose_nothing() -> None:
    store = make(max_artifacts_per_session=10_000, max_artifacts_per_trace=10_000)
    refs = await asyncio.gather(*(store.put_bytes(str(i).encode(), scope=session("s")) for i in range(300)))
    assert len({ref.id for ref in refs}) == 300
    assert store.count == 300
    assert await asyncio.gather(*(store.get(ref.id) for ref in refs)) == [str(i).encode() for i in range(300)]
