"""``guarded check MODULE:CALLABLE`` end to end, through ``python -m guarded`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guarded.cli import main
from guarded.testing import CONTRACTS
from tests.broken_stores import BROKEN_CONTRACTS

REPO = Path(__file__).resolve().parent.parent


def guarded(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "guarded", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_broken_store_exits_1_and_names_the_failing_contracts() -> None:
    completed = guarded("check", "tests.broken_stores:make_broken_store")
    assert completed.returncode == 1, completed.stderr
    out = completed.stdout
    assert out.startswith(
        "scratch: a new in-memory store, nothing was persisted\n\n"
        "capabilities of tests.broken_stores.BrokenStore:\n"
    )
    assert "  planner_state          yes      save_planner_state, load_planner_state" in out
    assert "legacy aliases: save_task_update, list_task_updates, get_events" in out
    summary = f"{len(CONTRACTS) - len(BROKEN_CONTRACTS)} passed, {len(BROKEN_CONTRACTS)} failed, 0 errors"
    assert f"contracts of tests.broken_stores.BrokenStore: {summary}" in out
    for name in BROKEN_CONTRACTS:
        assert f"  FAILED  {name}\n" in out
    assert "load_planner_state returned {} for a missing token; the spec requires None" in out
    assert out.rstrip().splitlines()[-1].startswith("not passed: ")


@pytest.mark.parametrize("factory", ["make_memory_store", "make_memory_store_async"])
def test_reference_store_from_sync_and_async_factories_exits_0(factory: str) -> None:
    completed = guarded("check", f"tests.broken_stores:{factory}")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "capabilities of guarded.backends.memory.InMemoryStateStore:" in completed.stdout
    assert completed.stdout.rstrip().endswith("every offered contract passed")


def test_minimal_store_reports_what_it_does_not_offer() -> None:
    completed = guarded("check", "tests.broken_stores:make_minimal_store")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "  planner_state          no       not offered" in completed.stdout
    assert (
        "  -       4 planner_state contracts: capability planner_state not offered by "
        "tests.broken_stores.MinimalStore" in completed.stdout
    )


def test_only_selects_contracts_and_capabilities() -> None:
    passing = guarded("check", "tests.broken_stores:make_broken_store", "--only", "core.event_roundtrip")
    assert passing.returncode == 0, passing.stdout
    assert "1 passed, 0 failed, 0 errors, 0 not offered" in passing.stdout
    failing = guarded(
        "check", "tests.broken_stores:make_broken_store", "--only", "planner_state", "--only", "memory_state"
    )
    assert failing.returncode == 1
    assert "7 passed, 2 failed" in failing.stdout


def test_json_output() -> None:
    completed = guarded("check", "tests.broken_stores:make_broken_store", "--json")
    assert completed.returncode == 1
    document = json.loads(completed.stdout)
    assert document["store"] == "tests.broken_stores.BrokenStore"
    assert document["ok"] is False
    assert document["capabilities"]["planner_state"] == {"offered": True, "missing": []}
    assert document["artifact_store"] == "InMemoryArtifactStore"
    failed = {item["name"] for item in document["results"] if item["status"] == "failed"}
    assert failed == BROKEN_CONTRACTS


@pytest.mark.parametrize(
    ("factory", "store_type", "message"),
    [
        ("make_closing_store", "ClosingStore", "ClosingStore: aclose() called"),
        ("make_sync_closing_store", "SyncClosingStore", "SyncClosingStore: close() called"),
    ],
)
def test_the_store_is_closed(factory: str, store_type: str, message: str) -> None:
    completed = guarded("check", f"tests.broken_stores:{factory}", "--only", "core")
    assert completed.returncode == 0, completed.stderr
    assert f"capabilities of tests.broken_stores.{store_type}:" in completed.stdout
    assert message in completed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no_colon_here"], "invalid factory 'no_colon_here': expected 'module.path:callable'"),
        (["tests.broken_stores:"], "expected 'module.path:callable'"),
        (["tests.no_such_module:make"], "cannot import 'tests.no_such_module': no module named"),
        (
            ["tests.broken_stores:make_nothing"],
            "module 'tests.broken_stores' has no attribute 'make_nothing'",
        ),
        (["tests.broken_stores:NOT_CALLABLE"], "'tests.broken_stores:NOT_CALLABLE' is a int, not a callable"),
        (
            ["tests.broken_stores:make_memory_store", "--only", "planner_stat"],
            "unknown contract or capability",
        ),
    ],
)
def test_usage_and_import_errors_exit_2(args: list[str], message: str) -> None:
    completed = guarded("check", *args)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    [line] = completed.stderr.splitlines()
    assert line.startswith("error: ")
    assert message in line
    assert "; hint: " in line
    assert completed.stdout == ""


def test_a_factory_that_cannot_reach_its_backend_exits_3() -> None:
    completed = guarded("check", "tests.broken_stores:make_failing_factory")
    assert completed.returncode == 3, completed.stdout + completed.stderr
    assert completed.stderr == (
        "error: cannot reach the store's backend: calling 'tests.broken_stores:make_failing_factory' failed: "
        "ConnectionRefusedError: database is down; hint: check that the store's backend is up and the "
        "factory's connection settings\n"
    )
    assert completed.stdout == ""


def test_an_unknown_store_is_checked_with_a_warning() -> None:
    completed = guarded("check", "tests.broken_stores:make_minimal_store", "--json")
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr.startswith(
        "warning: guarded check cannot verify where tests.broken_stores.MinimalStore keeps its data"
    )
    assert json.loads(completed.stdout)["scratch"]["kind"] == "unverified"


def test_main_returns_argparse_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 2
    assert "the following arguments are required: MODULE:CALLABLE" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "check" in capsys.readouterr().out
    assert main(["check", "--help"]) == 0
    assert "--only NAME" in capsys.readouterr().out
    assert main([]) == 2
