"""The bench runs end to end on token sizes and reports every protocol method with its targets.

Not a timed test: figures of a run this small mean nothing. It only keeps ``make bench`` from
rotting: every section runs against a real embedded PostgreSQL, and the report has a row for every
method of the protocol in the guard table and in the PostgreSQL table.
"""

from __future__ import annotations

import re

import pytest

from benchmarks import guard_profile, pooler_cost, redis_bench
from benchmarks.__main__ import main
from benchmarks.workload import PROTOCOL_METHODS, NullStore, calls
from guarded.protocol import CAPABILITIES


def test_every_protocol_method_has_a_benchmarked_call() -> None:
    called = {method for capability in CAPABILITIES for method in capability.methods} - {"artifact_store"}
    assert set(PROTOCOL_METHODS) == called
    assert set(calls()) == called
    assert all(callable(getattr(NullStore(), method)) for method in called)


def test_tiny_run_reports_every_method_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tiny"]) == 0
    report = capsys.readouterr().out

    guard_table, _, rest = report.partition("PostgreSQL: embedded server")
    protocol_table, _, rest = rest.partition("== postgres: bulk")
    for method in PROTOCOL_METHODS:
        rows = re.findall(rf"^{method}\s.*$", guard_table, flags=re.MULTILINE)
        assert any("no provider" in row for row in rows), method
        assert any("ALWAYS_OFF" in row for row in rows), method
        assert re.search(rf"^{method}\s+\d", protocol_table, flags=re.MULTILINE), method
    for target in (
        "guard added µs (target <= 5)",
        "guard/lean added (target <= 0.33)",
        "fail-fast read with the breaker open <= 10 µs/call",
        "raw asyncpg µs",
        "COPY, rows by the store's encode_events",
        "batched save_event >= 0.8x COPY (store encoding) at 10 writers, each awaiting its write",
        "batched save_event >= 0.8x COPY (store encoding) at 10 writers, pipelined",
        "a hand-written group commit (no guard, same callers) reaches",
        "hand x unbatched",
        "batched save_event >= 0.8x COPY (store encoding) at 10 writers, write-behind (opt-in ack='enqueue')",
        "caller latency, call to commit",
        "== targets, this run",
        "== workers: ",
        "== history: load_history",
        "load_history p50 flat within 1.5x",
        "== retention: one day of 30",
        "by partition drop >= 100x faster than DELETE",
        "x 1 worker",
    ):
        assert target in report, target
    pooling = report.partition("== cost of transaction pooling per call")[2].partition("\n== ")[0]
    for method in pooler_cost.METHODS:  # direct, pooler=transaction, no timeout, through PgBouncer
        assert re.search(rf"^{method}\s+\d+(\s+\d+\s+[\d.]+){{3}}\s*$", pooling, flags=re.MULTILINE), method
    assert re.search(
        r"^\s*(met|NOT MET)\s+guard\(PostgresStateStore\) pooler=\"transaction\" <= 1.15x", report, re.M
    )
    for workers in (1, 2):
        assert re.search(rf"^pgbouncer\s+{workers}\s+[\d,]+\s", report, flags=re.MULTILINE), workers
    assert "rows stored for" not in report  # every write the workers were acknowledged is stored
    assert "held by the guard" not in report


def test_profile_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert guard_profile.main(["--method", "load_memory_state", "--calls", "200", "--top", "3"]) == 0
    assert "per call" in capsys.readouterr().out


def test_snapshot_section_reports_capture_and_restore(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tiny", "--section", "snapshots"]) == 0
    report = capsys.readouterr().out
    assert "== snapshots: capture and restore of a session of 1,000 events and 2.0 MB of artifacts" in report
    for operation in ("capture", "restore"):
        for backend in ("file", "postgres"):
            assert re.search(rf"^{operation}\s+{backend}\s+\d", report, flags=re.MULTILINE), (
                operation,
                backend,
            )
    assert "target peak RSS < 200.0 MB" in report


def test_redis_section_reports_every_method_and_the_pause_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tiny", "--section", "redis"]) == 0
    report = capsys.readouterr().out
    table = report.partition("== guard(RedisStateStore) against raw redis-py")[2].partition("\n== ")[0]
    for method in redis_bench.METHODS:  # commands, raw, bare, x raw, guard, x raw
        assert re.search(rf"^{method}\s+\d+\s+\d+\s+\d+\s+[\d.]+\s+\d+\s+[\d.]+\s*$", table, re.M), method
    assert re.search(r"^\s*(met|NOT MET)\s+guard\(RedisStateStore\) <= 1.15x raw redis-py", report, re.M)
    for store in ("redis", "postgresql"):
        assert re.search(rf"^{store}\s+10\s+[\d.]+\s+[\d.]+\s*$", report, re.M), store
    assert "postgresql / redis: p50 " in report
