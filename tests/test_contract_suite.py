"""The contract suite (``guarded.testing``) against the reference store, a broken one and a minimal one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from guarded.backend import current_logical_time
from guarded.backends.memory import InMemoryStateStore
from guarded.errors import WriteSupersededError
from guarded.logical_time import logical_times, replaying
from guarded.models import StoredEvent, TaskState
from guarded.protocol import CAPABILITIES
from guarded.testing import (
    CONTRACTS,
    ContractStatus,
    StateStoreContract,
    run_contract,
    run_contracts,
    select_contracts,
)
from tests.broken_stores import BROKEN_CONTRACTS, BrokenStore, MinimalStore

REPO = Path(__file__).resolve().parent.parent
ALL = {item.name for item in CONTRACTS}
CORE = {item.name for item in CONTRACTS if item.capability == "core"}


class TestInMemoryStore(StateStoreContract):
    @pytest.fixture
    def store(self) -> InMemoryStateStore:
        return InMemoryStateStore()


class TestInMemoryStoreAsyncFixture(StateStoreContract):
    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[InMemoryStateStore]:
        store = InMemoryStateStore()
        yield store
        store.clear()


def names(results: list[Any]) -> set[str]:
    return {result.name for result in results}


@pytest.mark.asyncio
async def test_contracts_run_against_a_shared_non_empty_store() -> None:
    store = InMemoryStateStore()
    first = await run_contracts(store)
    second = await run_contracts(store)
    assert first.ok, str(first)
    assert second.ok, str(second)
    assert names(second.passed) == ALL


@pytest.mark.asyncio
async def test_in_memory_store_returning_penguiflow_records_passes() -> None:
    pytest.importorskip("penguiflow")
    from guarded.codec import penguiflow_types

    report = await run_contracts(InMemoryStateStore(record_types=penguiflow_types()))
    assert report.ok, str(report)


@pytest.mark.asyncio
async def test_broken_store_fails_exactly_its_bugs() -> None:
    report = await run_contracts(BrokenStore())
    assert names(report.failed) == BROKEN_CONTRACTS, str(report)
    assert names(report.passed) == ALL - BROKEN_CONTRACTS
    assert not report.errors
    assert not report.not_offered
    assert not report.ok


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "phrases"),
    [
        (
            "planner_state.missing_token_none",
            ["load_planner_state returned {} for a missing token", "the spec requires None", "missing token"],
        ),
        ("planner_state.consume_once", ["second load_planner_state of a consumed token returned {}", "None"]),
        ("core.history_ascending_ts", ["came back with ts [3.0, 2.0, 1.0]", "ascending ts order"]),
        (
            "core.history_same_ts_insertion_order",
            ["expected ['n0', 'n1', 'n3', 'n2', 'n9', 'n5']", "insertion"],
        ),
        ("bulk_events.ordered", ["expected ['b', 'd', 'f', 'e', 'a', 'c']", "must not change ordering"]),
        (
            "tasks.updates_since_id_exclusive",
            [
                "list_updates(since_id='A2') returned ['A2', 'A3', 'A4'], expected ['A3', 'A4']",
                "exclusive cursor",
            ],
        ),
    ],
)
async def test_broken_store_messages_say_what_is_wrong(name: str, phrases: list[str]) -> None:
    report = await run_contracts(BrokenStore(), only=[name])
    [result] = report.results
    assert result.status is ContractStatus.FAILED
    for phrase in phrases:
        assert phrase in result.message
    assert "spec 00" in result.message


@pytest.mark.asyncio
async def test_minimal_store_offers_only_the_core() -> None:
    report = await run_contracts(MinimalStore())
    assert names(report.passed) == CORE, str(report)
    assert names(report.not_offered) == ALL - CORE
    assert report.ok
    for result in report.not_offered:
        assert re.fullmatch(
            r"capability \w+ not offered by tests\.broken_stores\.MinimalStore", result.message
        )


def test_every_capability_has_contracts_and_names_are_unique() -> None:
    assert len(ALL) == len(CONTRACTS)
    assert {item.capability for item in CONTRACTS} == {capability.name for capability in CAPABILITIES}
    for item in CONTRACTS:
        assert item.name.startswith(f"{item.capability}."), item.name
        assert item.description


def test_select_contracts_by_name_and_capability() -> None:
    assert [item.name for item in select_contracts(["tasks.upsert"])] == ["tasks.upsert"]
    planner = select_contracts(["planner_state", "core.event_roundtrip"])
    assert {item.name for item in planner} == {
        "core.event_roundtrip",
        "planner_state.roundtrip",
        "planner_state.consume_once",
        "planner_state.missing_token_none",
        "planner_state.save_idempotent",
    }
    with pytest.raises(ValueError, match=r"'planner_stat'.*planner_state"):
        select_contracts(["planner_stat"])


class NoBindings:
    async def save_event(self, event: StoredEvent) -> None:
        return None

    async def load_history(self, trace_id: str) -> list[StoredEvent]:
        return []


@pytest.mark.asyncio
async def test_a_store_missing_required_methods_fails_the_core() -> None:
    report = await run_contracts(NoBindings(), only=["core"])
    assert names(report.failed) == CORE
    assert "lacks save_remote_binding" in report["core.event_roundtrip"].message


class HangingStore(InMemoryStateStore):
    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        await asyncio.Event().wait()
        return None


@pytest.mark.asyncio
async def test_a_store_that_blocks_fails_with_a_timeout() -> None:
    report = await run_contracts(
        HangingStore(), only=["planner_state.missing_token_none"], per_contract_timeout=0.05
    )
    [result] = report.failed
    assert "did not finish within 0.05s" in result.message
    assert "MUST NOT block indefinitely" in result.message


class ExplodingStore(InMemoryStateStore):
    async def save_task(self, state: TaskState) -> None:
        raise RuntimeError("disk on fire")


@pytest.mark.asyncio
async def test_an_unexpected_exception_is_an_error_not_a_failure() -> None:
    [contract] = select_contracts(["tasks.roundtrip"])
    result = await run_contract(ExplodingStore(), contract)
    assert result.status is ContractStatus.ERROR
    assert isinstance(result.exception, RuntimeError)
    assert result.message.startswith("RuntimeError: disk on fire (raised at ")


class NoArtifacts(InMemoryStateStore):
    @property
    def artifact_store(self) -> None:  # type: ignore[override]
        return None


@pytest.mark.asyncio
async def test_artifact_store_none_means_artifacts_not_offered() -> None:
    report = await run_contracts(NoArtifacts(), only=["artifacts"])
    assert len(report.not_offered) == len(report.results) > 0
    assert "(artifact_store is None)" in report.not_offered[0].message


class TasksWithoutAliases(MinimalStore):
    def __init__(self) -> None:
        super().__init__()
        self._inner = InMemoryStateStore()
        self.save_task = self._inner.save_task
        self.list_tasks = self._inner.list_tasks
        self.save_update = self._inner.save_update
        self.list_updates = self._inner.list_updates


@pytest.mark.asyncio
async def test_contracts_needing_more_than_their_capability_are_not_offered() -> None:
    report = await run_contracts(TasksWithoutAliases(), only=["tasks"])
    assert names(report.not_offered) == {"tasks.legacy_save_task_update", "tasks.legacy_list_task_updates"}
    assert "save_task_update not offered by" in report["tasks.legacy_save_task_update"].message
    assert report.ok


@pytest.mark.asyncio
async def test_report_renders_as_text_and_json() -> None:
    report = await run_contracts(BrokenStore(), only=["planner_state", "tasks.updates_since_id_exclusive"])
    text = str(report)
    assert text.splitlines()[0] == (
        "contracts of tests.broken_stores.BrokenStore: 2 passed, 3 failed, 0 errors, 0 not offered"
    )
    assert re.search(r"^  FAILED  planner_state\.missing_token_none\s*$", text, re.MULTILINE)
    assert re.search(r"^  passed  planner_state\.roundtrip\s*$", text, re.MULTILINE)
    assert text.splitlines()[-1] == (
        "not passed: planner_state.consume_once, planner_state.missing_token_none, "
        "tasks.updates_since_id_exclusive"
    )
    document = json.loads(json.dumps(report.to_dict()))
    assert document["ok"] is False
    assert document["summary"] == {"passed": 2, "failed": 3, "not offered": 0, "error": 0}
    assert [item["status"] for item in document["results"]].count("failed") == 3
    with pytest.raises(KeyError):
        report["no.such.contract"]


DOWNSTREAM = """
import pytest
from guarded.testing import StateStoreContract
from tests.broken_stores import BrokenStore, MinimalStore


class TestMinimal(StateStoreContract):
    @pytest.fixture
    def store(self):
        return MinimalStore()


class TestBroken(StateStoreContract):
    @pytest.fixture
    def store(self):
        return BrokenStore()
"""


def test_mixin_in_a_downstream_project_with_strict_asyncio(tmp_path: Path) -> None:
    (tmp_path / "test_downstream.py").write_text(textwrap.dedent(DOWNSTREAM))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=strict",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-rfs",
            "test_downstream.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    assert re.search(
        rf"{len(BROKEN_CONTRACTS)} failed, {len(CORE) + len(ALL) - len(BROKEN_CONTRACTS)} passed, "
        rf"{len(ALL) - len(CORE)} skipped",
        output,
    ), output
    for name in BROKEN_CONTRACTS:
        assert f"FAILED test_downstream.py::TestBroken::test_contract[{name}]" in output
    assert "capability planner_state not offered by tests.broken_stores.MinimalStore" in output


class ComparesEveryWrite(InMemoryStateStore):
    """The rule before direct writes were always applied: every save_memory_state is compared by
    logical time, and a refused one is dropped silently."""

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        with logical_times((current_logical_time(),)), replaying(), contextlib.suppress(WriteSupersededError):
            await super().save_memory_state(key, state)


@pytest.mark.asyncio
async def test_a_store_comparing_direct_writes_or_hiding_refusals_fails_the_ordering_contracts() -> None:
    ordering = ["memory_state.direct_write_applied", "memory_state.refused_replay_reported"]
    assert (await run_contracts(InMemoryStateStore(), only=ordering)).ok
    report = await run_contracts(ComparesEveryWrite(), only=ordering)
    assert names(report.failed) == set(ordering), str(report)
    messages = {result.name: result.message for result in report.results}
    assert "a direct write must be applied" in messages["memory_state.direct_write_applied"]
    assert "without raising WriteSupersededError" in messages["memory_state.refused_replay_reported"]
