"""The ``snapshots`` section: capture and restore of a big session, time and peak RSS.

A session of ``events`` runtime events (in traces of 1,000: ``load_history`` answers a whole trace,
so a trace is the unit a capture holds) and ``artifact_bytes`` of 1 MiB artifacts (random bytes:
incompressible) is written into a ``PostgresStateStore`` (the embedded server). Then, each in a
process of its own so that its peak RSS (``ru_maxrss``) is the operation's alone:

* **capture**: ``capture(postgres_state_store, session_id=...)`` then ``save`` into a snapshot store
  (the file backend, and the PostgreSQL one);
* **restore**: ``load`` from that snapshot store and ``restore`` into an empty
  ``PostgresStateStore`` (another schema).

Target: peak RSS under 200 MB for 100,000 events and 100 MB of artifacts. The RSS of
the process once its imports are done and its stores are open is printed beside it (``baseline``).

Run as a script, this module is that process::

    python -m benchmarks.snapshot_bench capture|restore DSN SCHEMA BACKEND WHERE [SNAPSHOT_ID]

and prints one JSON line: seconds, peak and baseline RSS in bytes, the snapshot's id and size.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .workload import reset_schemas

SECTION = "snapshots"
SESSION = "bench-session"
EVENTS_PER_TRACE = 1_000
ARTIFACT_SIZE = 1 << 20
TARGET_RSS = 200 * 1024 * 1024
BACKENDS = ("file", "postgres")

FULL = (100_000, 100 * 1024 * 1024)
QUICK = (20_000, 20 * 1024 * 1024)
TINY = (1_000, 2 * 1024 * 1024)


def _retention() -> Any:
    from guarded.models import ArtifactRetentionConfig

    big = 1 << 40
    return ArtifactRetentionConfig(
        max_artifact_bytes=ARTIFACT_SIZE * 2,
        max_session_bytes=big,
        max_trace_bytes=big,
        max_artifacts_per_session=1_000_000,
        max_artifacts_per_trace=1_000_000,
    )


async def _state_store(dsn: str, schema: str) -> Any:
    from prometheus_client import CollectorRegistry

    from guarded.backends.postgres import PoolSettings, PostgresStateStore

    return await PostgresStateStore.connect(
        dsn,
        schema=schema,
        pool=PoolSettings(min_size=1, max_size=4, command_timeout=600.0, statement_timeout=None),
        registry=CollectorRegistry(),
        stats_interval=None,
        artifact_retention=_retention(),
    )


async def populate(dsn: str, schema: str, events: int, artifact_bytes: int) -> None:
    """Write the session into ``schema``."""
    from guarded.models import ArtifactScope, StoredEvent

    store = await _state_store(dsn, schema)
    try:
        traces = max(1, events // EVENTS_PER_TRACE)
        batch: list[Any] = []
        for index in range(events):
            trace = f"{SESSION}-t{index % traces}"
            payload = {"i": index, "text": "observation " * 8, "tokens": [index, index + 1, index + 2]}
            batch.append(StoredEvent(trace, float(index), "node_end", "worker", f"n{index % 7}", payload))
            if len(batch) >= 5_000:
                await store.save_events(batch)
                batch = []
        if batch:
            await store.save_events(batch)
        for index in range(artifact_bytes // ARTIFACT_SIZE):
            scope = ArtifactScope(session_id=SESSION, trace_id=f"{SESSION}-t{index % traces}")
            await store.artifact_store.put_bytes(
                os.urandom(ARTIFACT_SIZE), mime_type="application/octet-stream", scope=scope
            )
    finally:
        await store.close()


def _rss_bytes() -> int:
    """This process's peak RSS. On Linux ``VmHWM`` of its own address space: ``ru_maxrss`` is
    kept across ``execve``, so a child of the bench (which grows to hundreds of MB in the earlier
    sections) would start at its parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


async def _snapshot_store(backend: str, dsn: str, where: str) -> Any:
    if backend == "file":
        from guarded.snapshots import FileSnapshotStore

        return FileSnapshotStore(where)
    from guarded.backends.postgres import PoolSettings, PostgresSnapshotStore

    return await PostgresSnapshotStore.connect(
        dsn, schema=where, pool=PoolSettings(min_size=1, max_size=4, command_timeout=600.0)
    )


async def _child(
    action: str, dsn: str, schema: str, backend: str, where: str, snapshot_id: str
) -> dict[str, Any]:
    from guarded.snapshots import capture, restore

    store = await _state_store(dsn, schema)
    snapshots = await _snapshot_store(backend, dsn, where)
    try:
        baseline = _rss_bytes()
        started = time.perf_counter()
        if action == "capture":
            async with await capture(store, session_id=SESSION, snapshot_id=snapshot_id) as captured:
                saved = await snapshots.save(captured)
            size = saved.total_bytes
            records = sum(saved.counts.values())
        else:
            async with await snapshots.load(snapshot_id) as content:
                report = await restore(content, store)
                size = content.snapshot.total_bytes
            records = sum(report.written.values())
        seconds = time.perf_counter() - started
    finally:
        await store.close()
        close = getattr(snapshots, "close", None)
        if close is not None:
            await close()
    return {
        "seconds": seconds,
        "peak_rss": _rss_bytes(),
        "baseline_rss": baseline,
        "bytes": size,
        "records": records,
    }


@dataclass(frozen=True, slots=True)
class Row:
    operation: str
    backend: str
    seconds: float
    peak_rss: int
    baseline_rss: int
    bytes: int
    records: int

    @property
    def met(self) -> bool:
        return self.peak_rss < TARGET_RSS


@dataclass(frozen=True, slots=True)
class Report:
    events: int
    artifact_bytes: int
    rows: tuple[Row, ...]

    @property
    def met(self) -> bool:
        return all(row.met for row in self.rows)


def _run_child(*argv: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.snapshot_bench", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"snapshot bench child {argv[0]} failed:\n{completed.stderr[-4000:]}")
    found: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return found


async def run(dsn: str, *, events: int, artifact_bytes: int, backends: tuple[str, ...] = BACKENDS) -> Report:
    """Populate a session, then capture and restore it in child processes, per snapshot backend."""

    tag = uuid.uuid4().hex[:10]
    source = f"bench_snap_src_{tag}"
    schemas = [source]
    await populate(dsn, source, events, artifact_bytes)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="guarded-snapshot-bench-") as directory:
        for backend in backends:
            where = str(Path(directory) / "snapshots") if backend == "file" else f"bench_snap_store_{tag}"
            target = f"bench_snap_dst_{tag}_{backend}"
            schemas += [target] + ([where] if backend == "postgres" else [])
            snapshot_id = f"bench-{backend}"
            for operation, schema in (("capture", source), ("restore", target)):
                found = await asyncio.to_thread(
                    _run_child, operation, dsn, schema, backend, where, snapshot_id
                )
                rows.append(Row(operation, backend, **found))
    await reset_schemas(dsn, *schemas)
    return Report(events, artifact_bytes, tuple(rows))


def _mb(count: float) -> str:
    return f"{count / (1024 * 1024):,.1f} MB"


def format_report(report: Report) -> str:
    lines = [
        f"== snapshots: capture and restore of a session of {report.events:,} events and "
        f"{_mb(report.artifact_bytes)} of artifacts (PostgresStateStore; each in its own process) ==",
        "",
        f"{'operation':<10}{'snapshot store':<16}{'seconds':>9}{'records/s':>12}{'MB/s':>8}"
        f"{'peak RSS':>12}{'baseline':>11}  target peak RSS < {_mb(TARGET_RSS)}",
    ]
    for row in report.rows:
        rate = row.records / row.seconds if row.seconds else 0.0
        throughput = row.bytes / row.seconds / (1024 * 1024) if row.seconds else 0.0
        lines.append(
            f"{row.operation:<10}{row.backend:<16}{row.seconds:>9.1f}{rate:>12,.0f}{throughput:>8.1f}"
            f"{_mb(row.peak_rss):>12}{_mb(row.baseline_rss):>11}  {'met' if row.met else 'NOT MET'}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    action, dsn, schema, backend, where, *rest = argv
    found = asyncio.run(_child(action, dsn, schema, backend, where, rest[0] if rest else uuid.uuid4().hex))
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
