"""``run_demo`` end to end: a real PostgreSQL restarted, its connections killed, its tables locked,
bad payloads sent, a real PenguiFlow flow running, ``/metrics`` scraped during the run; then the
verdict, computed by reading the database back, and proof that it notices a missing write.

One run (about 14 s of workload, an overload and a cross-worker phase included) serves every test
of the module. The server is the test's own and stays up after the run, so the last tests can
damage the database and judge again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from guarded.demo import DemoOptions, DemoResult, parse_schedule, run_demo
from guarded.demo.ledger import WriteKind
from guarded.demo.readback import read_back
from guarded.demo.runner import SCHEMA
from guarded.demo.verdict import Verdict, compute_verdict
from guarded.observability import telemetry_names as names
from guarded.testing.postgres import EmbeddedPostgres, free_port

DURATION = 14.0
SCHEDULE = (
    "bad@0.5,kill@1.2:1,restart@2.6:2,slow@5.8:1.5,pause-fail@7.8:2.5,overload@10.5:1.4,cross-worker@12:1"
)
"""Fault phases never overlap: the overload phase asserts that load alone, on a healthy database,
changes nothing in the breaker (it overlapped the pause-fail lock until 10.3 s before)."""


@dataclass
class DemoRun:
    result: DemoResult
    scrapes: list[str]
    """Bodies of ``/metrics`` fetched while the demo ran."""
    output: str
    dsn: str


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except OSError:
        return None


@pytest.fixture(scope="module")
def demo_run() -> Iterator[DemoRun]:
    server = EmbeddedPostgres(settings={"synchronous_commit": "on"})
    server.start()
    port = free_port()
    options = DemoOptions(
        duration=DURATION, concurrency=8, faults=SCHEDULE, metrics_port=port, live=False, seed=7
    )
    out = io.StringIO()

    async def run_and_scrape() -> tuple[DemoResult, list[str]]:
        demo = asyncio.create_task(run_demo(options, server=server, out=out))
        scrapes: list[str] = []
        while not demo.done():
            body = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
            if body:
                scrapes.append(body)
            await asyncio.sleep(0.5)
        return await demo, scrapes

    try:
        result, scrapes = asyncio.run(run_and_scrape())
        yield DemoRun(result, scrapes, out.getvalue(), server.dsn)
    finally:
        server.destroy()


@pytest.fixture
def verdict(demo_run: DemoRun) -> Verdict:
    return demo_run.result.verdict


def test_every_acknowledged_write_is_in_the_database(verdict: Verdict) -> None:
    assert verdict.passed, verdict.to_dict()
    assert verdict.lost == 0
    assert verdict.mismatched == 0
    assert verdict.escaped == {}
    assert verdict.acknowledged > 1000
    assert verdict.persisted == verdict.acknowledged
    for kind in WriteKind:
        assert verdict.writes[kind].acknowledged > 0, kind


def test_the_faults_were_felt_and_the_held_writes_replayed(verdict: Verdict) -> None:
    assert verdict.outcomes["dead_lettered"] > 0
    assert verdict.dead_letters["enqueued_total"] > 0
    assert verdict.dead_letters["replayed_total"] > 0
    assert verdict.dead_letters["dropped_total"] == 0
    assert verdict.dead_letters["left_after_drain"] == 0


def test_every_fault_of_the_schedule_happened(verdict: Verdict) -> None:
    planned = parse_schedule(SCHEDULE, DURATION)
    records = sorted(verdict.faults, key=lambda record: record.planned_at)
    assert [(record.kind, record.planned_at) for record in records] == [
        (fault.kind.value, fault.at) for fault in planned
    ]
    assert all(record.happened for record in records), [record.to_dict() for record in records]
    effects = {record.kind: record.effect for record in records}
    assert effects["restart"].startswith("database down")
    assert "store connections terminated" in effects["kill"]
    assert "pause saves missed their deadline" in effects["pause-fail"]
    pause_saves_failed = int(effects["pause-fail"].split("; ")[-1].split()[0])
    assert pause_saves_failed > 0
    assert effects["overload"].startswith("1000 callers")
    assert effects["overload"].endswith("circuit breaker state changes meanwhile: 0"), effects["overload"]
    assert "worker A held 40 writes while partitioned" in effects["cross-worker"]
    assert effects["cross-worker"].endswith("(0 left) 40 of 40 keys hold B's value"), effects["cross-worker"]


def test_bad_payloads_are_parked_or_rejected_with_their_reason(demo_run: DemoRun, verdict: Verdict) -> None:
    results = {(item.method, item.result) for item in verdict.bad_payloads}
    assert results == {
        ("save_event", "parked"),
        ("save_memory_state", "parked"),
        ("save_task", "parked"),
        ("save_planner_state", "parked"),
        ("save_update", "parked"),
        ("artifact_store.put_bytes", "rejected"),
    }
    parked_reasons = [item.reason for item in verdict.bad_payloads if item.result == "parked"]
    assert all("InvalidPayloadError" in reason for reason in parked_reasons)
    assert any("lone surrogate" in reason for reason in parked_reasons)
    assert any("nan is not a valid JSON number" in reason for reason in parked_reasons)
    assert "ArtifactTooLargeError" in verdict.bad_payloads[-1].reason
    assert verdict.unexpected_parked == []
    assert demo_run.result.ledger.nul_writes == 3  # NUL text is valid: stored exactly, checked above


def test_penguiflow_saved_its_own_events_through_the_guard(demo_run: DemoRun) -> None:
    ledger = demo_run.result.ledger
    assert ledger.penguiflow_runs > 0
    assert ledger.penguiflow_events >= 4 * ledger.penguiflow_runs  # node_start/success of two nodes


def test_metrics_were_served_during_the_run(demo_run: DemoRun) -> None:
    assert demo_run.result.metrics_url is not None
    assert len(demo_run.scrapes) >= 5
    # Scraped from a thread while the run goes on: the last scrape may come after the guard closed
    # (its store series are removed then), so each series must have been served by some scrape.
    served = "\n".join(demo_run.scrapes)
    for metric in (
        names.CALL_DURATION + "_bucket",
        names.CALLS + "_total",
        names.CIRCUIT_STATE,
        names.DLQ_DEPTH,
        names.DLQ_REPLAYED,
        names.BATCH_PENDING,
        names.GUARDED_PG_POOL_SIZE,
    ):
        assert f"\n{metric}{{" in served, metric
    assert 'outcome="dead_lettered"' in served
    assert 'method="save_planner_state"' in served
    if importlib.util.find_spec("guarded.telemetry") is not None:
        assert names.TASK_EVENTS in served


def test_the_progress_lines_name_the_faults(demo_run: DemoRun) -> None:
    output = demo_run.output
    assert "fault: database down" in output
    assert "fault: pause-fail: 1 table(s) locked" in output
    assert "fault: restart over: database down" in output
    assert "draining" in output or "verifying" in output


def test_the_verdict_notices_a_write_missing_from_the_database(demo_run: DemoRun) -> None:
    result = demo_run.result
    trace, kind, node_id, ts = next(iter(result.ledger.appends[WriteKind.EVENT]))

    async def delete_one_event() -> None:
        conn = await asyncpg.connect(demo_run.dsn)
        try:
            deleted = await conn.execute(
                f'DELETE FROM "{SCHEMA}".flow_events WHERE trace_id = $1 AND kind = $2 AND ts = $3',
                trace,
                kind,
                ts,
            )
            assert deleted == "DELETE 1"
        finally:
            await conn.close()

    asyncio.run(delete_one_event())
    snapshot = asyncio.run(read_back(demo_run.dsn, SCHEMA))
    damaged = compute_verdict(
        result.ledger,
        snapshot,
        parked=result.parked,
        call_counts=result.call_counts,
        rejection_reasons=result.rejection_reasons,
    )
    assert damaged.lost == 1
    assert not damaged.passed
    assert damaged.writes[WriteKind.EVENT].examples == [f"missing {(trace, kind, node_id, ts)!r}"]
