"""Randomized: processes of several applications, each over a PostgreSQL schema of its own, share
one state directory through crashes. Their stores are the PostgreSQL store (its identity declared:
server, database, schema) or a store of the application's own that declares none. Each process
writes through a backend failing at random, so writes are held in spill files (the default ones,
and one explicit path every application shares), and is SIGKILLed at a random moment while later
processes adopt what the killed ones left. Then a healthy process per application drains. No held
write ever reaches a store of another identity, and every acknowledged write is in its own store.

``GUARDED_IDENTITY_SEED`` replays a failing run (the seed is in every failure message).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from guarded.deadletter import SpillFile
from tests.cli.support import clean_environment
from tests.postgres._identity_worker import application
from tests.postgres.conftest import StoreFactory, new_schema_name

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = 3
WORKERS = 10
LIVE = 3
"""Workers alive at once: each is killed at a random moment and the next one started."""
NAMES = ("default", "jobs")
KINDS = ("declared", "custom")
ERROR_RATES = (0.5, 0.9, 1.0)
_STARTUP_TIMEOUT = 60.0


@dataclass
class _Worker:
    process: subprocess.Popen[str]
    schema: str
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.endswith("\n"):
                break  # cut by the kill: never acknowledged as printed
            if line == "ready\n":
                self.ready.set()
            else:
                self.lines.append(line.rstrip("\n"))
        self.ready.set()


def _start(program: Path, arguments: list[str], env: dict[str, str], log: Path, schema: str) -> _Worker:
    process = subprocess.Popen(
        [sys.executable, str(program), *arguments],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    worker = _Worker(process, schema)
    worker.reader = threading.Thread(target=worker.read, daemon=True)
    worker.reader.start()
    return worker


def _waiting_in(directory: Path) -> int:
    waiting = 0
    for path in directory.rglob("*.sqlite*"):
        if path.name.endswith(("-wal", "-shm", ".lock")) or ".corrupt-" in path.name:
            continue
        spill = SpillFile.open_read_only(str(path))
        try:
            waiting += spill.totals().pending
        finally:
            spill.close()
    return waiting


@dataclass
class _Run:
    """One randomized run: its seed, stores and state directory, and what it saw."""

    seed: int
    dsn: str
    schemas: list[str]
    directory: Path
    acknowledged: dict[str, set[str]] = field(default_factory=dict)
    used: set[tuple[str, str, str, str]] = field(default_factory=set)

    @property
    def state(self) -> Path:
        return self.directory / "state"

    def program(self, schema: str) -> Path:
        """The launcher of the application over ``schema`` (written on first use)."""
        program = self.directory / "apps" / schema / "app.py"
        if not program.exists():
            program.parent.mkdir(parents=True)
            program.write_text(application())
        return program

    def crash_workers(self) -> None:
        """Start :data:`WORKERS` writers, :data:`LIVE` at a time, each SIGKILLed at a random moment."""
        rng = random.Random(self.seed)
        places = ("default", str(self.state / "guarded" / "shared.sqlite"))
        env = clean_environment(XDG_STATE_HOME=str(self.state))
        self.acknowledged = {schema: set() for schema in self.schemas}
        alive: list[tuple[_Worker, float]] = []
        for number in range(WORKERS):
            schema, kind, name = rng.choice(self.schemas), rng.choice(KINDS), rng.choice(NAMES)
            place = rng.choice(places)
            rate = 1.0 if number % LIVE == 0 else rng.choice(ERROR_RATES)
            self.used.add((schema, kind, name, place))
            arguments = ["write", self.dsn, schema, kind, name, place, str(rng.randrange(2**31)), str(rate)]
            worker = _start(
                self.program(schema), arguments, env, self.directory / f"worker{number}.log", schema
            )
            assert worker.ready.wait(_STARTUP_TIMEOUT), f"seed {self.seed}: a worker never started"
            alive.append((worker, time.monotonic() + rng.uniform(0.3, 1.5)))
            while len(alive) >= LIVE or (number == WORKERS - 1 and alive):
                victim, kill_at = min(alive, key=lambda entry: entry[1])
                time.sleep(max(0.0, kill_at - time.monotonic()))
                victim.process.send_signal(signal.SIGKILL)
                alive.remove((victim, kill_at))
                victim.process.wait(timeout=30)
                assert victim.reader is not None
                victim.reader.join(timeout=30)
                assert victim.process.returncode == -signal.SIGKILL, (
                    f"seed {self.seed}: a worker ended on its own"
                )
                self.acknowledged[victim.schema].update(victim.lines)

    def drain(self) -> None:
        """A healthy guard of every store, name and place the workers used drains what waits, in a
        process of the store's application (one per schema, at once)."""
        env = clean_environment(XDG_STATE_HOME=str(self.state))
        drains = []
        for schema in self.schemas:
            stores = sorted(entry for entry in self.used if entry[0] == schema)
            log = self.directory / f"drain-{schema}.log"
            drains.append(
                (
                    _start(self.program(schema), ["drain", self.dsn, json.dumps(stores)], env, log, schema),
                    stores,
                    log,
                )
            )
        for drain, stores, log in drains:
            drain.process.wait(timeout=240)
            assert drain.reader is not None
            drain.reader.join(timeout=30)
            assert drain.process.returncode == 0, f"seed {self.seed}: {log.read_text()[-3000:]}"
            assert drain.lines == ["0"] * len(stores), (
                f"seed {self.seed}: writes left after the drains: {drain.lines}"
            )


async def test_held_writes_stay_with_their_store_through_crashes(
    make_store: StoreFactory, pg_dsn: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("GUARDED_IDENTITY_SEED") or random.randrange(2**32))
    run = _Run(seed, pg_dsn, [new_schema_name() for _ in range(SCHEMAS)], tmp_path)
    for schema in run.schemas:
        await make_store(schema=schema)  # migrated before the workers race
    started = time.monotonic()
    await asyncio.to_thread(run.crash_workers)
    held = _waiting_in(run.state)
    crashed = time.monotonic()
    assert held > 0, f"seed {seed}: no write was held when the workers were killed: the test proves nothing"
    await asyncio.to_thread(run.drain)
    assert _waiting_in(run.state) == 0, f"seed {seed}: held writes left in the state directory"

    connection = await asyncpg.connect(pg_dsn)
    try:
        for schema in run.schemas:
            rows = await connection.fetch(f'SELECT key, state FROM "{schema}".memory_states')
            foreign = [row["key"] for row in rows if not row["key"].startswith(f"{schema}/")]
            assert foreign == [], f"seed {seed}: {len(foreign)} write(s) of other stores reached {schema}"
            assert all(json.loads(row["state"])["schema"] == schema for row in rows)
            lost = sorted(run.acknowledged[schema] - {row["key"] for row in rows})
            assert not lost, f"seed {seed}: {len(lost)} acknowledged write(s) of {schema} lost: {lost[:5]}"
    finally:
        await connection.close()
    total = sum(len(keys) for keys in run.acknowledged.values())
    assert total > 0
    print(
        f"seed {seed}: {total} acknowledged writes, {held} held at the crashes; "
        f"{crashed - started:.1f}s of crashes, {time.monotonic() - crashed:.1f}s of drains"
    )
