"""Redis's errors, raised by a real server, are classified so retry, breaker and dead letters do the
right thing: a stopped server is connection loss (retried, never sent when refused), a replica's
``READONLY`` is retried, ``BUSY`` is retried, ``OOM`` is held (insufficient resources), and too few
replicas for ``replicas_to_ack`` is held."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio
from redis import exceptions as redis_exceptions

from guarded import guard
from guarded.backend import ErrorClass
from guarded.backends.redis import RedisStateStore, ReplicasNotAcknowledgedError
from guarded.error_classes import classify, operational_condition, reached_backend, safe_message
from guarded.testing.redis import RedisServer


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module's own: the tests stop it and change its settings."""
    with RedisServer.started() as server:
        yield server


async def failure(call: asyncio.Future[object] | object) -> BaseException:
    try:
        await call  # type: ignore[misc]
    except Exception as exc:
        return exc
    raise AssertionError("the call did not fail")


@pytest.mark.asyncio
async def test_a_stopped_server_is_connection_loss_never_sent(own_server: RedisServer) -> None:
    store = await RedisStateStore.connect(own_server.url, prefix="stopped", socket_timeout=2.0)
    try:
        own_server.kill()
        error = await failure(store.save_memory_state("t:u:s", {"x": 1}))
        assert isinstance(error, redis_exceptions.ConnectionError)
        assert classify(error) is ErrorClass.RETRYABLE  # the write may have been sent: retried
        assert safe_message(error) == "redis ConnectionError"
        refused = await failure(store.save_memory_state("t:u:s", {"x": 1}))  # a new connection
        assert isinstance(refused, redis_exceptions.ConnectionError)
        assert classify(refused) is ErrorClass.RETRYABLE
        assert reached_backend(refused) is False  # refused: provably never sent
    finally:
        own_server.restart()
        await store.close()


@pytest.mark.asyncio
async def test_out_of_memory_is_held_as_insufficient_resources(own_server: RedisServer) -> None:
    store = await RedisStateStore.connect(own_server.url, prefix="oom")
    admin = redis_asyncio.Redis.from_url(own_server.url)
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", 1)
        error = await failure(store.save_memory_state("t:u:s", {"x": 1}))
        assert isinstance(error, redis_exceptions.OutOfMemoryError)
        assert classify(error) is ErrorClass.OPERATIONAL
        assert operational_condition(error) == "insufficient_resources"
        assert safe_message(error) == "redis OOM"
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_busy_server_is_retried(own_server: RedisServer) -> None:
    store = await RedisStateStore.connect(own_server.url, prefix="busy")
    admin = redis_asyncio.Redis.from_url(own_server.url)
    looping = redis_asyncio.Redis.from_url(own_server.url)
    try:
        await admin.config_set("busy-reply-threshold", 50)
        busy = asyncio.ensure_future(looping.eval("while true do end", 0))
        error: BaseException | None = None
        for _ in range(200):  # until the script has run past the threshold
            try:
                await store.save_memory_state("t:u:s", {"x": 1})
            except redis_exceptions.ResponseError as exc:
                error = exc
                break
            await asyncio.sleep(0.02)
        assert error is not None
        assert str(error).startswith("BUSY")
        assert classify(error) is ErrorClass.RETRYABLE
        assert operational_condition(error) == "server_unavailable"
        await admin.script_kill()
        with contextlib.suppress(redis_exceptions.ResponseError):
            await busy
    finally:
        await admin.config_set("busy-reply-threshold", 5000)
        await admin.aclose()
        await looping.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_replica_answers_readonly_and_replicas_to_ack_waits_for_it(own_server: RedisServer) -> None:
    alone = await RedisStateStore.connect(own_server.url, prefix="ack", replicas_to_ack=1, ack_timeout=0.2)
    try:
        error = await failure(alone.save_memory_state("t:u:s", {"x": 1}))
        assert isinstance(error, ReplicasNotAcknowledgedError)
        assert classify(error) is ErrorClass.OPERATIONAL  # held and replayed
        with RedisServer.started(extra=["--replicaof", "127.0.0.1", str(own_server.port)]) as replica:
            on_replica = await RedisStateStore.connect(replica.url, prefix="ack")
            try:
                error = await failure(on_replica.save_memory_state("t:u:s", {"x": 1}))
                assert isinstance(error, redis_exceptions.ReadOnlyError)
                assert classify(error) is ErrorClass.RETRYABLE
                assert operational_condition(error) == "read_only"
                acked = await RedisStateStore.connect(
                    own_server.url, prefix="ack", replicas_to_ack=1, ack_timeout=10
                )
                try:
                    for _ in range(100):  # until the replica has synchronised
                        try:
                            await acked.save_memory_state("t:u:s", {"x": 2})
                            break
                        except ReplicasNotAcknowledgedError:
                            await asyncio.sleep(0.1)
                    assert await on_replica.load_memory_state("t:u:s") == {"x": 2}  # on the replica
                finally:
                    await acked.close()
            finally:
                await on_replica.close()
    finally:
        await alone.close()


@pytest.mark.asyncio
async def test_a_server_loading_its_data_is_retried_and_a_guarded_write_lands() -> None:
    """A restarted server answers ``LOADING`` while it reads its data set back: retried (the server
    is unavailable for now), and a write through the guard made then is acknowledged and kept.
    Two million keys (``DEBUG POPULATE``) take the restart a second or two to load."""
    with RedisServer.started(extra=("--enable-debug-command", "yes")) as server:
        client = redis_asyncio.Redis.from_url(server.url)
        try:
            await client.execute_command("DEBUG", "POPULATE", 2_000_000)
            await client.bgrewriteaof()  # the data set as the append-only file's base
            for _ in range(600):
                if not (await client.info("persistence"))["aof_rewrite_in_progress"]:
                    break
                await asyncio.sleep(0.05)
        finally:
            await client.aclose()
        server.kill()
        server.restart(wait=False)
        store = RedisStateStore(redis_asyncio.Redis.from_url(server.url), prefix="loading", owns_client=True)
        try:
            seen: BaseException | None = None
            while seen is None:  # the process is up before it listens; then it loads for seconds
                try:
                    await store.load_memory_state("k:s")
                except redis_exceptions.BusyLoadingError as exc:
                    seen = exc
                except redis_exceptions.ConnectionError:
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the server answered before it had loaded its data set")
            assert classify(seen) is ErrorClass.RETRYABLE
            assert operational_condition(seen) == "server_unavailable"
            guarded = guard(store, name="loading", registry=CollectorRegistry())
            async with guarded:
                await guarded.save_memory_state("k:s", {"v": 1})
            server.wait_ready()
            assert await store.load_memory_state("k:s") == {"v": 1}
        finally:
            await store.close()


def test_cluster_errors_are_retried() -> None:
    for error in (
        redis_exceptions.TryAgainError("TRYAGAIN"),
        redis_exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis_exceptions.MasterDownError("MASTERDOWN"),
    ):
        assert classify(error) is ErrorClass.RETRYABLE
    assert classify(redis_exceptions.NoPermissionError("NOPERM")) is ErrorClass.OPERATIONAL
    assert (
        classify(redis_exceptions.ResponseError("ERR string exceeds maximum allowed size"))
        is ErrorClass.REJECTED
    )
    assert classify(redis_exceptions.ResponseError("ERR unknown")) is ErrorClass.FATAL
    assert safe_message(redis_exceptions.ResponseError("ERR quoting 'a secret value'")) == "redis ERR"


@pytest.mark.asyncio
async def test_a_flushed_script_cache_is_reloaded_not_an_error(
    store: RedisStateStore, raw_redis: redis_asyncio.Redis
) -> None:
    await store.save_memory_state("k:s", {"v": 1})
    await raw_redis.script_flush()  # a restart or a failover to a node that never saw the scripts
    await store.save_memory_state("k:s", {"v": 2})
    assert await store.load_memory_state("k:s") == {"v": 2}
