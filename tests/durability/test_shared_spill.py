"""Processes on one spill path: each claims a slot file of its own, the files of a process that is
gone are adopted (replayed) by a live or a later one, and only by a guard over the same backend
target (host, database, schema). Own server (it is stopped)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.config import DeadLetterConfig, GuardConfig
from guarded.guard import controller, guard
from guarded.testing.postgres import EmbeddedPostgres
from tests.postgres._outages import differences, drain_all, open_store
from tests.postgres.conftest import new_schema_name

from ._support import Worker, eventually
from ._worker import MixedLedger, describe, landed_differences, ledger_of, read_back_mixed

PROCESSES, WRITERS = 4, 4
"""Four processes of four writers each (process ``p`` has writers ``4p .. 4p + 3``)."""


def writers_of(process: int) -> range:
    return range(process * WRITERS, (process + 1) * WRITERS)


@pytest.mark.asyncio
async def test_four_processes_share_a_spill_path_and_a_killed_ones_writes_are_adopted(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path
) -> None:
    """Four workers with the same ``DeadLetterConfig(path=...)`` write through an outage; the last
    one started (the last to claim the path) is killed while it holds writes; the others finish
    (drain, close: they may adopt its file) and a fresh guard on the path drains whatever is left."""
    spill = tmp_path / "shared" / "dlq.sqlite"
    workers: list[Worker] = []
    try:
        for process in range(PROCESSES):
            first = writers_of(process).start
            arguments = ["ack", "--dsn", server.dsn, "--schema", schema_name, "--first", str(first)]
            arguments += ["--writers", str(WRITERS), "--pause", "0.01", "--fast", "--spill", str(spill)]
            worker = Worker(arguments, state_home=state_home, log=tmp_path / f"worker-{process}.log")
            workers.append(worker)
            # One after the other, so the processes claim the path in this order.
            await eventually(
                lambda worker=worker: worker.acked >= 10 or worker.exited(), what="a worker writing"
            )
            assert not worker.exited(), worker.stderr()
        await eventually(
            lambda: all(worker.acked >= 40 for worker in workers), what="writes before the outage"
        )

        await asyncio.to_thread(server.stop)
        at_stop = [worker.acked for worker in workers]
        await eventually(
            lambda: all(worker.acked >= acked + 40 for worker, acked in zip(workers, at_stop, strict=True)),
            what="writes held during the outage by every process",
        )
        killed = workers[-1]
        killed.kill()
        await asyncio.to_thread(server.start)
        for worker in workers[:-1]:
            worker.terminate()  # stop writing, drain, close
        for worker in workers[:-1]:
            assert await asyncio.to_thread(worker.wait, 120) == 0, worker.stderr()
    finally:
        for worker in workers:
            worker.kill()
    assert [worker.errors for worker in workers] == [[]] * PROCESSES

    config = GuardConfig(dead_letter=DeadLetterConfig(path=str(spill)))
    async with guard(
        await open_store(server.dsn, schema_name), registry=CollectorRegistry(), config=config
    ) as store:
        left = await drain_all(store, seconds=60)
    assert left == 0

    acks = [ack for worker in workers for ack in worker.acks]
    acked = ledger_of(acks)
    at_most = ledger_of([*acks, *killed.in_flight(writers_of(PROCESSES - 1))])
    problems = landed_differences(acked, at_most, await read_back_mixed(server.dsn, schema_name))
    assert not problems, describe(problems)


@pytest.mark.asyncio
async def test_a_spill_file_left_for_one_schema_is_never_replayed_into_another(
    server: EmbeddedPostgres, state_home: Path, tmp_path: Path
) -> None:
    """A worker over schema A (default spill path) is killed holding writes; a guard over schema B
    on the same state directory and guard name (so the same spill path) must leave them alone; a
    later guard over A delivers them all."""
    schema_a, schema_b = new_schema_name(), new_schema_name()
    for schema in (schema_a, schema_b):
        await (await open_store(server.dsn, schema)).close()  # migrated while the database is up
    per_writer = 45

    await asyncio.to_thread(server.stop)
    arguments = ["ack", "--dsn", server.dsn, "--schema", schema_a, "--writers", str(WRITERS)]
    arguments += ["--per-writer", str(per_writer), "--fast", "--lazy", "--hold"]
    worker = Worker(arguments, state_home=state_home, log=tmp_path / "worker-a.log")
    try:
        await eventually(lambda: worker.has("H") or worker.exited(), what="the writes for schema A held")
        assert not worker.exited(), worker.stderr()
    finally:
        worker.kill()
    assert worker.errors == []
    acked = ledger_of(worker.acks)
    assert acked.calls == WRITERS * per_writer
    await asyncio.to_thread(server.start)

    async with guard(await open_store(server.dsn, schema_b), registry=CollectorRegistry()) as store_b:
        assert await drain_all(store_b, seconds=10) == 0
    in_b = differences(MixedLedger(), await read_back_mixed(server.dsn, schema_b))
    assert not in_b, "a guard over schema B replayed writes held for schema A:\n" + describe(in_b)
    in_a = differences(MixedLedger(), await read_back_mixed(server.dsn, schema_a))
    assert not in_a, "writes held for schema A were delivered before a guard over A ran:\n" + describe(in_a)

    async with guard(await open_store(server.dsn, schema_a), registry=CollectorRegistry()) as store_a:
        assert await drain_all(store_a, seconds=60) == 0
    problems = differences(acked, await read_back_mixed(server.dsn, schema_a))
    assert not problems, describe(problems)


@pytest.mark.asyncio
async def test_an_adopted_worker_s_later_writes_win_over_this_process_s_earlier_ones(
    server: EmbeddedPostgres, schema_name: str, state_home: Path, tmp_path: Path
) -> None:
    """Two workers on the default spill path. This one writes ``direct`` (directly) and, during an
    outage, ``held`` (held in its slot); the other then writes both keys (held in its own slot,
    acknowledged) and is killed. Adopting its file, this one must deliver the other's later
    writes, not keep its own earlier ones: the logical times of the calls decide, not which
    process adopted whom. Found by an adversarial run, where both keys ended with the earlier value."""
    store = guard(await open_store(server.dsn, schema_name), registry=CollectorRegistry())
    await store.save_memory_state("direct", {"v": "earlier, this process"})
    other = Worker(
        ["memory", server.dsn, schema_name, "later, the other worker", "direct", "held"],
        state_home=state_home,
        log=tmp_path / "other.log",
    )
    try:
        await eventually(lambda: other.has("R") or other.exited(), what="the other worker ready")
        assert not other.exited(), other.stderr()
        await asyncio.to_thread(server.stop)
        await store.save_memory_state("held", {"v": "earlier, this process"})  # held: the server is down
        other.process.send_signal(signal.SIGUSR1)
        await eventually(lambda: other.has("H") or other.exited(), what="the other worker's writes held")
        assert not other.exited(), other.stderr()
    finally:
        other.kill()
    await asyncio.to_thread(server.start)
    assert await controller(store).drain(30) == 0
    await controller(store).aclose()
    check = await open_store(server.dsn, schema_name)
    try:
        for key in ("direct", "held"):
            assert await check.load_memory_state(key) == {"v": "later, the other worker"}, key
    finally:
        await check.close()
