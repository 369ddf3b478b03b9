"""Clock skew between workers never drops an acknowledged write; a write held by an older version
never overwrites a newer one.

Two real worker processes (:mod:`tests.postgres._skewed_worker`) on one real PostgreSQL, one with
its clock ahead (5 ms, 50 ms, 5 s; zero as control), write the same memory keys and trajectories
alternately, each write made after the other worker's returned: every write the guard answered
``ok`` must be in the database right after it returned, and every key must end with the causally
last value.

A held write from before logical times were kept with held writes (no ``_guarded_write_time`` in
its spill row), replayed after another worker wrote the key, must not overwrite that newer write.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer
from guarded.guard import controller, guard
from guarded.logical_time import WRITE_TIME_ARGUMENT

from .conftest import StoreFactory

REPO = Path(__file__).resolve().parents[2]
KEYS = 50
ROUNDS = 4
METHODS = ("save_memory_state", "save_trajectory")


class Worker:
    """A running :mod:`tests.postgres._skewed_worker` process."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        skew: float,
        name: str,
        spill: Path,
        module: str = "tests.postgres._skewed_worker",
    ) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, dsn, schema, str(skew), name, str(spill)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.expect("ready")

    def expect(self, word: str) -> list[str]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if not line or line[0] != word:
            self.process.kill()
            _, err = self.process.communicate(timeout=30)
            raise AssertionError(f"worker {self.name}: expected {word!r}, got {line}\n{err}")
        return line[1:]

    def write(self, method: str, key: str, round_: int) -> tuple[str, bool]:
        """The write of ``key`` for ``round_``: the outcome it was answered with, and whether the
        database held its value right after it returned."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"write {method} {key} {round_}\n")
        self.process.stdin.flush()
        outcome, applied = self.expect("done")
        return outcome, applied == "yes"

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        self.expect("closed")
        self.process.wait(timeout=60)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=30)


@pytest.mark.asyncio
@pytest.mark.parametrize("skew", [0.0, 0.005, 0.05, 5.0], ids=["no-skew", "5ms", "50ms", "5s"])
async def test_a_clock_ahead_never_drops_another_workers_acknowledged_write(
    skew: float,
    pg_dsn: str,
    schema_name: str,
    make_store: StoreFactory,
    workers: list[Worker],
    tmp_path: Path,
) -> None:
    reader = await make_store()  # migrated before the workers start
    ahead = Worker(pg_dsn, schema_name, skew, "ahead", tmp_path / "ahead.sqlite")
    workers.append(ahead)
    behind = Worker(pg_dsn, schema_name, 0.0, "behind", tmp_path / "behind.sqlite")
    workers.append(behind)

    await assert_alternating_writes_all_kept(ahead, behind, reader, skew)


@pytest.mark.asyncio
async def test_a_write_held_by_an_older_version_never_overwrites_a_newer_write(
    pg_dsn: str, schema_name: str, make_store: StoreFactory, tmp_path: Path
) -> None:
    """An older version kept held writes without the logical time of their call. After the
    upgrade another worker writes the key directly; then the upgraded process adopts the older
    version's spill file and replays its write: the newer value must stay, and the held write is
    counted as superseded, not as replayed. A pause it held is resumable after the replay (its
    call time unknown, its TTL counts from the replay)."""
    target = await make_store()
    path = tmp_path / "worker.sqlite"
    older = DeadLetterBuffer(
        DeadLetterConfig(path=str(path)),
        store_name="worker",
        registry=CollectorRegistry(),
        target=target.target_identity,
    )
    try:
        for name in ("contested", "uncontested"):
            kwargs: dict[str, Any] = {}
            assert WRITE_TIME_ARGUMENT not in kwargs  # as an older version held it
            await older.put(
                "save_memory_state",
                (name, {"by": "held before the upgrade"}),
                kwargs,
                key=name,
                stamp=1,
                error="x",
            )
            await older.put(
                "save_trajectory",
                (name, "s", {"by": "held before the upgrade"}),
                {},
                key=(name, "s"),
                stamp=2,
                error="x",
            )
        await older.put(
            "save_planner_state",
            ("paused", {"by": "held before the upgrade"}),
            {},
            key="paused",
            stamp=3,
            error="x",
        )
    finally:
        await older.aclose()

    other_worker = await make_store()
    await other_worker.save_memory_state("contested", {"by": "another worker, after the upgrade"})
    await other_worker.save_trajectory("contested", "s", {"by": "another worker, after the upgrade"})

    backend = await PostgresStateStore.connect(pg_dsn, schema=schema_name, registry=CollectorRegistry())
    upgraded = guard(backend, name="worker", registry=CollectorRegistry(), dead_letter={"path": str(path)})
    async with upgraded:
        dead_letters = controller(upgraded).dead_letters
        assert dead_letters.depth == 5, "the older version's held writes were not adopted"
        assert await controller(upgraded).drain() == 0
        stats = await dead_letters.stats()
    reader = await make_store()
    assert await reader.load_memory_state("contested") == {"by": "another worker, after the upgrade"}
    assert await reader.get_trajectory("contested", "s") == {"by": "another worker, after the upgrade"}
    assert await reader.load_memory_state("uncontested") == {"by": "held before the upgrade"}
    assert await reader.get_trajectory("uncontested", "s") == {"by": "held before the upgrade"}
    assert await reader.load_planner_state("paused") == {"by": "held before the upgrade"}
    assert (stats.replayed_total, stats.superseded_total) == (3, 2)


async def assert_alternating_writes_all_kept(ahead: Worker, behind: Worker, reader: Any, skew: float) -> None:
    """``ahead`` and ``behind`` write every key alternately, each write after the other's returned:
    every write answered ``ok`` is held by the store right after it returned, and every key ends
    with the causally last value (read through ``reader``). The Redis suite runs it too."""
    answered_ok = 0
    not_applied: list[tuple[str, str, int]] = []
    other_outcomes: list[str] = []
    for index in range(KEYS):
        key = f"key{index}"
        for method in METHODS:
            for round_ in range(ROUNDS):
                writer = ahead if round_ % 2 == 0 else behind  # each write after the other's returned
                outcome, applied = writer.write(method, key, round_)
                if outcome != "ok":
                    other_outcomes.append(f"{method}:{outcome}")
                    continue
                answered_ok += 1
                if not applied:
                    not_applied.append((method, key, round_))
    for worker in (ahead, behind):
        worker.close()

    last = {"round": ROUNDS - 1, "by": "behind"}
    memory_final = [await reader.load_memory_state(f"key{index}") for index in range(KEYS)]
    trajectory_final = [await reader.get_trajectory(f"key{index}", "s") for index in range(KEYS)]
    stale_memory = sum(state != last for state in memory_final)
    stale_trajectories = sum(trajectory != last for trajectory in trajectory_final)
    summary = (
        f"skew {skew}s: {answered_ok} of {2 * KEYS * ROUNDS} writes answered ok, {len(not_applied)} of them "
        f"never applied (first: {not_applied[:3]}); {stale_memory} of {KEYS} memory keys and "
        f"{stale_trajectories} of {KEYS} trajectories end with a causally older value; "
        f"other outcomes: {sorted(set(other_outcomes))}"
    )
    assert not other_outcomes, summary
    assert answered_ok == 2 * KEYS * ROUNDS, summary
    assert not not_applied, summary
    assert stale_memory == stale_trajectories == 0, summary
