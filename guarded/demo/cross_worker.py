"""The demo's ``cross-worker`` phase: a held write's replay racing another worker's newer write.

Two more workers take part, each with its own guard, pool and spill file, as two processes of a
deployment would:

* worker A, a guarded store in this process whose connections pass through a TCP proxy
  (:class:`PartitionProxy`), so the phase can cut A off the database while everyone else reaches it;
* worker B, another process (``python -m guarded.demo.cross_worker``), talking to the database
  directly.

The phase partitions A; A saves ``count`` memory states and trajectories (held in its spill file,
outcome ``dead_lettered``); B then saves newer values of the same keys; the partition heals and A
replays its held writes, older than B's. Every acknowledged write of both goes into the ledger in
that order, so an older value replayed over a newer one is a *lost* write in the verdict. The
effect says how many keys still hold B's value once A's buffer is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.config import DeadLetterConfig, GuardConfig, LoggingConfig, RetryConfig, TimeoutConfig
from guarded.guard import controller, guard

from .calls import ESCAPED, attempt, json_form
from .ledger import Ledger, WriteKind

WORKER_A_APPLICATION_NAME = "guarded-demo-worker-a"
WORKER_B_APPLICATION_NAME = "guarded-demo-worker-b"
SESSION = "cross-worker"
"""The session of the phase's trajectories."""
REPLAY_WAIT = 20.0
"""Seconds the phase waits for worker A to replay what it held once the partition heals."""


class PartitionProxy:
    """A TCP proxy to the database that can cut its clients off: ``partitioned`` resets every
    connection through it and refuses new ones (a network partition of one worker)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.partitioned = False
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def partition(self) -> None:
        """Reset every connection through the proxy and refuse new ones until :meth:`heal`."""
        self.partitioned = True
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def heal(self) -> None:
        self.partitioned = False

    async def close(self) -> None:
        self.partition()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._links.update((writer, upstream_writer))
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            self._links.discard(writer)
            writer.transport.abort()


def _via_proxy(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def worker_config(spill_path: str) -> GuardConfig:
    """The two workers' guard settings: the demo's short deadlines, their own spill file."""
    return GuardConfig(
        timeout=TimeoutConfig(attempt=0.5, deadline=1.0, critical_deadline=2.0),
        retry=RetryConfig(max_attempts=1),
        dead_letter=DeadLetterConfig(path=spill_path, drain_timeout=10.0),
        logging=LoggingConfig(interval=60.0),
    )


def memory_state(prefix: str, index: int, worker: str) -> dict[str, Any]:
    return {"worker": worker, "key": index, "turns": [{"role": "user", "content": f"{prefix} {worker}"}]}


def trajectory(worker: str) -> dict[str, Any]:
    return {"query": f"asked of worker {worker}", "steps": []}


async def run_cross_worker(
    *,
    dsn: str,
    schema: str,
    ledger: Ledger,
    count: int,
    prefix: str,
    duration: float,
    phase: Callable[[str], None],
) -> tuple[str, bool]:
    """Run the phase (see the module); its effect and whether it happened as planned."""
    parts = urlsplit(dsn)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    loop = asyncio.get_running_loop()
    try:
        with tempfile.TemporaryDirectory(prefix="guarded-demo-workers-") as scratch:
            backend = await PostgresStateStore.connect(
                _via_proxy(dsn, proxy.port),
                schema=schema,
                name="demo-worker-a",
                pool=PoolSettings(
                    min_size=1, max_size=4, connect_timeout=1.0, application_name=WORKER_A_APPLICATION_NAME
                ),
            )
            a = guard(
                backend,
                name="demo-worker-a",
                registry=CollectorRegistry(),
                config=worker_config(str(Path(scratch) / "worker-a.sqlite")),
            )
            async with a:
                started = loop.time()
                phase("worker A partitioned from the database")
                proxy.partition()
                held = 0
                for index in range(count):
                    key, trace = f"{prefix}:memory:{index}", f"{prefix}-trace-{index}"
                    state = memory_state(prefix, index, "A")
                    if await attempt(ledger, a.save_memory_state(key, state)) is not ESCAPED:
                        ledger.upsert(WriteKind.MEMORY, key, json_form(state))
                    doc = trajectory("A")
                    if await attempt(ledger, a.save_trajectory(trace, SESSION, doc)) is not ESCAPED:
                        ledger.upsert(WriteKind.TRAJECTORY, trace, (SESSION, json_form(doc)))
                buffer = controller(a).dead_letters
                held = buffer.depth if buffer is not None else 0
                phase(f"worker B (another process) writes newer values; worker A holds {held}")
                written = await _worker_b(dsn, schema, prefix, count, str(Path(scratch) / "worker-b.sqlite"))
                for key, state in written["memory"]:
                    ledger.upsert(WriteKind.MEMORY, key, json_form(state))
                for trace, session, doc in written["trajectory"]:
                    ledger.upsert(WriteKind.TRAJECTORY, trace, (session, json_form(doc)))
                await asyncio.sleep(max(0.0, duration - (loop.time() - started)))
                phase("partition healed: worker A replays its held (older) writes")
                proxy.heal()
                left = await controller(a).drain(REPLAY_WAIT)
            kept = await _holding_b(dsn, schema, prefix, count)
    finally:
        await proxy.close()
    newer = len(written["memory"]) + len(written["trajectory"])
    effect = (
        f"worker A held {held} writes while partitioned, worker B (pid {written['pid']}) wrote {newer} "
        f"newer values of the same keys; after A's replay ({left} left) {kept} of {2 * count} keys "
        "hold B's value"
    )
    return effect, held > 0 and newer == 2 * count and left == 0


async def _worker_b(dsn: str, schema: str, prefix: str, count: int, spill: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",  # the installed guarded, not a checkout that happens to be the current directory
        "-m",
        "guarded.demo.cross_worker",
        dsn,
        schema,
        prefix,
        str(count),
        spill,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"worker B exited {process.returncode}: {' | '.join(tail)}")
    found: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return found


async def _holding_b(dsn: str, schema: str, prefix: str, count: int) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        keys = [f"{prefix}:memory:{index}" for index in range(count)]
        traces = [f"{prefix}-trace-{index}" for index in range(count)]
        memory = await conn.fetch(f'SELECT state FROM "{schema}".memory_states WHERE key = ANY($1)', keys)
        docs = await conn.fetch(f'SELECT doc FROM "{schema}".trajectories WHERE trace_id = ANY($1)', traces)
    finally:
        await conn.close()
    states = [json.loads(row["state"]) for row in memory]
    values = [json.loads(row["doc"])["value"] for row in docs]
    b_states = sum(1 for state in states if state.get("worker") == "B")
    b_trajectories = sum(1 for value in values if value.get("query") == trajectory("B")["query"])
    return b_states + b_trajectories


async def _run_worker_b(dsn: str, schema: str, prefix: str, count: int, spill: str) -> dict[str, Any]:
    """Worker B: save newer values of the phase's keys through its own guard; what it was
    acknowledged."""
    backend = await PostgresStateStore.connect(
        dsn,
        schema=schema,
        name="demo-worker-b",
        pool=PoolSettings(min_size=1, max_size=4, application_name=WORKER_B_APPLICATION_NAME),
    )
    store = guard(backend, name="demo-worker-b", registry=CollectorRegistry(), config=worker_config(spill))
    written: dict[str, Any] = {"pid": os.getpid(), "memory": [], "trajectory": []}
    async with store:
        for index in range(count):
            key, trace = f"{prefix}:memory:{index}", f"{prefix}-trace-{index}"
            state = memory_state(prefix, index, "B")
            # A guarded store does not raise; a write that did would not be acknowledged.
            with contextlib.suppress(Exception):
                await store.save_memory_state(key, state)
                written["memory"].append((key, state))
            with contextlib.suppress(Exception):
                await store.save_trajectory(trace, SESSION, trajectory("B"))
                written["trajectory"].append((trace, SESSION, trajectory("B")))
    return written


def main(argv: list[str]) -> int:
    dsn, schema, prefix, count, spill = argv
    written = asyncio.run(_run_worker_b(dsn, schema, prefix, int(count), spill))
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["PartitionProxy", "run_cross_worker"]
