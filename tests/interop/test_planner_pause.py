"""PenguiFlow's ``ReactPlanner`` pauses in one process and resumes in another, through
``guard(PostgresStateStore)`` on a real PostgreSQL, including across a database outage.

The planner is the real ``penguiflow`` one, driven by a scripted LLM (no network); each process
is a real subprocess running tests/interop/_planner_worker.py. Contracts:

* spec 000 §4/§5 ``save_planner_state`` / ``load_planner_state``: the pause is durable, loaded
  once ("SHOULD delete/expire token after successful load"), ``None`` when unknown;
* spec 000 "ReactPlanner Integration": ``resume(token)`` loads the pause through the store;
* spec 002: pause save/load failures break HITL and must be observable;
* Failure vs not found: PenguiFlow cannot tell "token expired" from "store down" --
  ``ReactPlanner.resume`` raises ``KeyError(token)`` for both once the guard answers ``None``
  (penguiflow/planner/pause_management.py ``_load_pause_record``) -- so the guard's outcome,
  metric and log must.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from guarded.observability import telemetry_names as names
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres
from tests.postgres.conftest import new_schema_name

from . import _planner_support as support

REPO = Path(__file__).resolve().parents[2]
PROCESS_TIMEOUT = 60.0
STORE_DOWN_OUTCOMES = {"timeout", "circuit_open", "fallback"}


# --- processes ------------------------------------------------------------------------------------


def run_process(args: list[str], *, what: str) -> tuple[str, str]:
    """Run ``python -m ARGS`` from the repository root; its stdout and stderr. Killed when it
    outlives :data:`PROCESS_TIMEOUT`; a failure shows both streams."""
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(
            f"{what} still ran after {PROCESS_TIMEOUT}s\nstdout:\n{out}\nstderr:\n{err}"
        ) from None
    assert process.returncode == 0, f"{what} exited {process.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


async def worker(
    mode: str, dsn: str, schema: str, *, spill: Path | None = None, token: str = "", extra: Sequence[str] = ()
) -> dict[str, Any]:
    """One planner process (``pause`` or ``resume``, ``extra`` arguments); its JSON report plus
    ``stderr``."""
    args = ["tests.interop._planner_worker", mode, "--dsn", dsn, "--schema", schema, *extra]
    if spill is not None:
        args += ["--spill", str(spill)]
    if token:
        args += ["--token", token]
    out, err = await asyncio.to_thread(run_process, args, what=f"planner process '{mode}'")
    lines = out.strip().splitlines()
    assert lines, f"planner process '{mode}' printed nothing\nstderr:\n{err}"
    report: dict[str, Any] = json.loads(lines[-1])
    report["stderr"] = err
    return report


def explain(report: dict[str, Any]) -> str:
    """A report for an assertion message, without the bulky metrics text."""
    shown = {key: value for key, value in report.items() if key not in ("metrics", "stderr")}
    return json.dumps(shown, indent=1) + "\nstderr:\n" + str(report.get("stderr", ""))


# --- what the processes saw ---------------------------------------------------------------------


def calls_by_outcome(metrics_text: str, method: str) -> dict[str, float]:
    """``guarded_store_calls_total`` of ``method`` by outcome, read from Prometheus text format
    (outcomes that never happened, exported as 0, left out)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != names.CALLS:
            continue
        for sample in family.samples:
            if sample.name == f"{names.CALLS}_total" and sample.labels["method"] == method and sample.value:
                found[sample.labels["outcome"]] = sample.value
    return found


def guard_warnings(report: dict[str, Any], method: str) -> list[dict[str, Any]]:
    """The guard's WARNING/ERROR log records about ``method`` in a process."""
    return [
        record
        for record in report["logs"]
        if record["logger"].startswith("guarded")
        and record["level"] in ("WARNING", "ERROR")
        and record.get("method") == method
    ]


async def pause_row(dsn: str, schema: str, token: str) -> asyncpg.Record | None:
    """The ``planner_pauses`` row of ``token``, read behind the store's back."""
    conn = await asyncpg.connect(dsn)
    try:
        row: asyncpg.Record | None = await conn.fetchrow(
            f'SELECT consumed_at, consumer_key FROM "{schema}".planner_pauses WHERE token = $1', token
        )
        return row
    finally:
        await conn.close()


async def held_in_spill(path: Path) -> dict[str, Any]:
    """``guarded dlq list --json`` of a spill file (the operator's view, payloads not shown)."""
    out, _ = await asyncio.to_thread(
        run_process, ["guarded", "dlq", "list", "--path", str(path), "--json"], what="guarded dlq list"
    )
    listing: dict[str, Any] = json.loads(out)
    return listing


def assert_paused(report: dict[str, Any]) -> str:
    assert report["result"] == "paused", explain(report)
    assert report["reason"] == "approval_required"
    assert report["payload"] == {"order_id": support.ORDER_ID, "amount": support.AMOUNT}
    token: str = report["token"]
    return token


def assert_finished(report: dict[str, Any]) -> None:
    """The resumed run ended with the scripted answer, after the steps of both processes, and
    the LLM of the resuming process was shown the human's answer and the paused run's history."""
    assert report["result"] == "finished", explain(report)
    assert report["reason"] == "answer_complete"
    assert report["answer"] == support.FINAL_ANSWER
    assert report["steps"] == ["lookup_order", "request_approval", "issue_refund"]
    assert report["prompt_has_user_input"], explain(report)
    assert report["prompt_has_paused_observation"], explain(report)


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own: the outage tests stop it (the shared one stays up)."""
    with embedded_postgres() as server:
        yield server


@pytest.fixture
def server(own_server: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """The module's server, running again after the test whatever happened."""
    yield own_server
    if not own_server.running:
        own_server.start()


# --- tests ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_pause_in_one_process_resume_in_another(pg_dsn: str, schema_name: str) -> None:
    paused = await worker("pause", pg_dsn, schema_name)
    token = assert_paused(paused)
    # PenguiFlow saves each pause twice under its token: when the tool pauses, then with the pause
    # step added to the trajectory (pause_management._record_pause, react_runtime.run_loop).
    assert paused["calls"] == {"save_planner_state:ok": 2}, explain(paused)
    row = await pause_row(pg_dsn, schema_name, token)
    assert row is not None, "the pause must be in PostgreSQL"
    assert row["consumed_at"] is None

    resumed = await worker("resume", pg_dsn, schema_name, token=token)
    assert_finished(resumed)
    assert resumed["calls"] == {"load_planner_state:ok": 1}, explain(resumed)
    row = await pause_row(pg_dsn, schema_name, token)
    # Consumed under the guard's idempotency key (backends/postgres/pauses.py): marked, not deleted.
    assert row is not None
    assert row["consumed_at"] is not None, dict(row)
    assert row["consumer_key"], dict(row)


@pytest.mark.asyncio
async def test_pause_while_the_database_is_down_is_resumed_by_the_next_process(
    server: EmbeddedPostgres, tmp_path: Path
) -> None:
    schema, spill = new_schema_name(), tmp_path / "planner-dlq.sqlite"
    await asyncio.to_thread(server.stop)

    paused = await worker("pause", server.dsn, schema, spill=spill)
    token = assert_paused(paused)  # acknowledged: the planner returned its pause as usual
    # Both saves of the pause were held; the newer replaced the older (last write wins by token).
    assert paused["calls"] == {"save_planner_state:dead_lettered": 2}, explain(paused)
    assert paused["held_after_close"] == 1, explain(paused)  # draining gave up; the pause was kept
    warnings = guard_warnings(paused, "save_planner_state")
    assert warnings, explain(paused)
    assert {r["outcome"] for r in warnings} == {"dead_lettered"}, explain(paused)
    listing = await held_in_spill(spill)
    held = [(entry["method"], entry["key"]) for entry in listing["entries"]]
    assert held == [("save_planner_state", json.dumps(token))]  # keys are listed JSON-encoded

    await asyncio.to_thread(server.start)
    resumed = await worker("resume", server.dsn, schema, spill=spill, token=token)
    assert_finished(resumed)
    # Either the replay had written the pause before the resume read it (ok), or the resume took it
    # from the buffer (stale; then it is never replayed). Both consume it exactly once.
    assert set(resumed["calls"]) <= {"load_planner_state:ok", "load_planner_state:stale"}, explain(resumed)
    assert sum(resumed["calls"].values()) == 1, explain(resumed)
    assert resumed["held_after_close"] == 0, explain(resumed)
    assert any("left by a previous process" in r["message"] for r in resumed["logs"]), explain(resumed)
    # Consume once (spec 000 §5): a resume that took the pause while its replay was in flight must not
    # leave the replayed copy consumable in PostgreSQL.
    row = await pause_row(server.dsn, schema, token)
    assert row is None or row["consumed_at"] is not None, f"consumable again after {resumed['calls']}"


@pytest.mark.asyncio
async def test_unknown_token_is_not_found(
    pg_dsn: str, schema_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    store = support.guarded_postgres(pg_dsn, schema_name, spill=None, registry=registry)
    token = uuid.uuid4().hex
    caplog.set_level(logging.INFO, logger="guarded")
    async with store:
        planner = support.build_planner(store, support.ScriptedLLM(support.RESUME_SCRIPT))
        # PenguiFlow's not-found path: load_planner_state returned None -> KeyError(token).
        with pytest.raises(KeyError) as raised:
            await planner.resume(token, user_input=support.APPROVAL)
    assert raised.value.args == (token,)
    metrics = generate_latest(registry).decode()
    assert calls_by_outcome(metrics, "load_planner_state") == {"not_found": 1.0}
    from_guard = [record for record in caplog.records if record.name.startswith("guarded")]
    assert from_guard, "the guard's loggers are captured (the fresh schema's migrations are logged)"
    assert [record.getMessage() for record in from_guard if record.levelno >= logging.WARNING] == []


@pytest.mark.asyncio
async def test_resume_while_the_database_is_down_is_a_store_failure_not_a_missing_token(
    server: EmbeddedPostgres,
) -> None:
    schema = new_schema_name()
    token = assert_paused(await worker("pause", server.dsn, schema))
    await asyncio.to_thread(server.stop)

    # This process never held the pause (no spill file, an empty buffer): nothing stale to serve.
    failed = await worker("resume", server.dsn, schema, token=token)
    assert failed["result"] == "resume_failed", explain(failed)
    # What PenguiFlow's caller sees is exactly the unknown-token failure...
    assert failed["error_type"] == "KeyError", explain(failed)
    assert failed["error"] == str(KeyError(token)), explain(failed)
    # ...but the guard says the store failed: metric outcome and a WARNING, never not_found.
    outcomes = calls_by_outcome(failed["metrics"], "load_planner_state")
    assert outcomes, failed["metrics"]
    assert set(outcomes) <= STORE_DOWN_OUTCOMES, outcomes
    assert sum(outcomes.values()) == 1
    warnings = guard_warnings(failed, "load_planner_state")
    assert warnings, explain(failed)
    assert {r["outcome"] for r in warnings} <= STORE_DOWN_OUTCOMES, explain(failed)
    assert all(r["event"] == "statestore_call_failed" for r in warnings)
    # The log names the cause: the database refused the connection (or, on a starved machine,
    # did not answer in time).
    assert {r["error_type"] for r in warnings} <= {"ConnectionRefusedError", "TimeoutError"}, explain(failed)

    await asyncio.to_thread(server.start)
    # The failed resume consumed nothing: once the database is back the same token resumes.
    resumed = await worker("resume", server.dsn, schema, token=token)
    assert_finished(resumed)
    row = await pause_row(server.dsn, schema, token)
    assert row is not None
    assert row["consumed_at"] is not None
