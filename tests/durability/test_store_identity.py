"""A held write belongs to exactly one store: separate processes of unrelated applications that
share one user's state directory, with every default, never deliver each other's held writes.

Process A holds a write (its store is down) and is SIGKILLed; what B does next must never put
A's write into B's store, while A's next run still delivers it into A's own store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.deadletter import SpillFile
from tests.durability._identity_app import application

pytestmark = pytest.mark.asyncio

_TIMEOUT = 60.0


def _write_app(directory: Path, name: str, store_class: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / f"{name}.py"
    program.write_text(application(store_class))
    return program


def _run(program: Path, *arguments: str, log: Path, kill_after_report: bool) -> Any:
    """Run ``program``; its first JSON line. With ``kill_after_report`` it is SIGKILLed then."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    with (
        log.open("w") as errors,
        subprocess.Popen(
            [sys.executable, str(program), *arguments],
            cwd=program.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as process,
    ):
        assert process.stdout is not None
        watchdog = threading.Timer(_TIMEOUT, process.kill)
        watchdog.start()
        try:
            line = process.stdout.readline()
            if kill_after_report:
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=_TIMEOUT)
        finally:
            watchdog.cancel()
    assert line, f"{program.name} printed nothing:\n{log.read_text()}"
    if kill_after_report:
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 0, log.read_text()
    return json.loads(line)


def _waiting_in(directory: Path) -> int:
    """Writes waiting in every spill file under ``directory`` (read-only)."""
    waiting = 0
    for path in directory.rglob("*.sqlite*"):
        if path.name.endswith(("-wal", "-shm", ".lock")):
            continue
        spill = SpillFile.open_read_only(str(path))
        try:
            waiting += spill.totals().pending
        finally:
            spill.close()
    return waiting


def _state_home() -> Path:
    return Path(os.environ["XDG_STATE_HOME"])


async def test_a_killed_processs_held_write_never_reaches_a_fresh_in_memory_store(tmp_path: Path) -> None:
    program = _write_app(tmp_path / "app_a", "app_a", "DownStore")
    held = _run(
        program,
        str(tmp_path / "a-data.json"),
        "down",
        "procA-key",
        "process A",
        log=tmp_path / "a.log",
        kill_after_report=True,
    )
    assert held == {"held": 1}
    assert _waiting_in(_state_home()) == 1

    memory = InMemoryStateStore()
    fresh = guard(memory, registry=CollectorRegistry())
    async with fresh:
        await fresh.save_memory_state("b-key", {"from": "process B"})
        assert await controller(fresh).drain(5) == 0
        assert await fresh.load_memory_state("procA-key") is None, "process A's write reached B's store"
    assert await memory.load_memory_state("procA-key") is None
    assert _waiting_in(_state_home()) == 1, "process A's held write must stay kept for A"


async def test_two_applications_sharing_a_state_directory_never_get_each_others_writes(
    tmp_path: Path,
) -> None:
    app_a = _write_app(tmp_path / "app_a", "app", "TenantAStore")
    app_b = _write_app(tmp_path / "app_b", "app", "TenantBStore")
    a_data, b_data = tmp_path / "a-data.json", tmp_path / "b-data.json"

    held = _run(
        app_a,
        str(a_data),
        "down",
        "tenantA:secret",
        "A's secret",
        log=tmp_path / "a.log",
        kill_after_report=True,
    )
    assert held == {"held": 1}

    b_ran = _run(
        app_b, str(b_data), "up", "tenantB:key", "B's value", log=tmp_path / "b.log", kill_after_report=False
    )
    assert "tenantA:secret" not in b_ran["data"], "application B received application A's held write"
    assert b_ran["data"] == {"tenantB:key": {"value": "B's value"}}
    assert _waiting_in(_state_home()) == 1, "A's held write must stay kept for A"

    a_again = _run(
        app_a, str(a_data), "up", "tenantA:other", "later", log=tmp_path / "a2.log", kill_after_report=False
    )
    assert a_again["held"] == 0
    assert a_again["data"] == {
        "tenantA:secret": {"value": "A's secret"},
        "tenantA:other": {"value": "later"},
    }, "application A's next run must deliver its own held write"
    assert json.loads(b_data.read_text()) == {"tenantB:key": {"value": "B's value"}}
