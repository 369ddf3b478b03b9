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
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer, SpillFile
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
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


class _DeclaredStore(InMemoryStateStore):
    """A store that keeps its data elsewhere (as a database does) and declares its identity."""

    durable_across_processes = True

    def __init__(self, identity: str) -> None:
        super().__init__()
        self.target_identity = identity


class _CustomStore(InMemoryStateStore):
    """A store that keeps its data across processes but declares no identity."""

    durable_across_processes = True


async def _hold(path: Path, target: str, key: str) -> None:
    """A spill file at ``path`` holding one write of ``key`` for ``target``, as an earlier process left it."""
    earlier = DeadLetterBuffer(
        DeadLetterConfig(path=str(path)), store_name="default", registry=CollectorRegistry(), target=target
    )
    await earlier.put(
        "save_memory_state", (key, {"held": key}), {}, key=key, stamp=1, error="ConnectionRefusedError"
    )
    await earlier.aclose()


async def test_a_store_that_keeps_nothing_across_processes_has_no_spill_file(tmp_path: Path) -> None:
    from penguiflow.state import InMemoryStateStore as PenguiFlowMemoryStore

    for store in (InMemoryStateStore(), PenguiFlowMemoryStore()):
        guarded_store = guard(
            store, registry=CollectorRegistry(), spill_path=str(tmp_path / "dlq-{name}.sqlite")
        )
        buffer = controller(guarded_store).dead_letters
        assert buffer is not None
        assert buffer.path is None, f"{type(store).__module__} got a spill file"
        if getattr(store, "artifact_store", None) is not None:
            assert guarded_store.artifact_store is not None
            artifacts = controller(guarded_store).artifact_dead_letters
            assert artifacts is not None
            assert artifacts.path is None, "its artifacts got a spill file"
        await controller(guarded_store).aclose()
    assert [name for name in os.listdir(tmp_path) if name.startswith("dlq-")] == []


async def test_the_default_spill_file_is_one_per_store_identity(tmp_path: Path) -> None:
    paths = set()
    for store, name in (
        (_DeclaredStore("custom://db/a"), "default"),
        (_DeclaredStore("custom://db/b"), "default"),
        (_CustomStore(), "default"),
        (_CustomStore(), "jobs"),
    ):
        guarded_store = guard(store, name=name, registry=CollectorRegistry())
        buffer = controller(guarded_store).dead_letters
        assert buffer is not None
        assert buffer.path is not None
        paths.add(buffer.path)
        await controller(guarded_store).aclose()
    assert len(paths) == 4
    assert all(Path(path).parent == _state_home() / "guarded" for path in paths)


async def test_held_writes_at_the_former_default_path_reach_only_their_own_store(tmp_path: Path) -> None:
    former = _state_home() / "guarded" / "default.sqlite"
    await _hold(former, "custom://db/a", "a-key")
    await _hold(Path(f"{former}.1"), "guard:default", "unattributable-key")
    await _hold(Path(f"{former}.2"), "custom://db/b", "b-key")

    store = _DeclaredStore("custom://db/a")
    guarded_store = guard(store, registry=CollectorRegistry())
    async with guarded_store:
        assert await controller(guarded_store).drain(5) == 0
    assert await store.load_memory_state("a-key") == {"held": "a-key"}, (
        "the former default file was not delivered"
    )
    assert await store.load_memory_state("b-key") is None
    assert await store.load_memory_state("unattributable-key") is None
    assert not former.exists(), "the adopted file is removed"
    assert _waiting_in(former.parent) == 2, "the other stores' writes stay kept"

    custom = _CustomStore()
    guarded_custom = guard(custom, registry=CollectorRegistry())
    async with guarded_custom:
        assert await controller(guarded_custom).drain(5) == 0
    assert await custom.load_memory_state("unattributable-key") is None, (
        "a guard:<name> file is never adopted"
    )


async def test_an_explicit_shared_path_keeps_applications_apart(tmp_path: Path) -> None:
    spill = str(tmp_path / "shared.sqlite")
    a_backend = _CustomStore()
    down = FaultyStore(a_backend, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))
    a = guard(
        down,
        registry=CollectorRegistry(),
        spill_path=spill,
        dead_letter={"application": "app-a", "drain_timeout": 0},  # closed without trying the store again
    )
    async with a:
        await a.save_memory_state("a-key", {"owner": "app-a"})
    b_backend = _CustomStore()
    b = guard(b_backend, registry=CollectorRegistry(), spill_path=spill, dead_letter={"application": "app-b"})
    async with b:
        assert await controller(b).drain(2) == 0
    assert await b_backend.load_memory_state("a-key") is None, "application A's write reached application B"
    fault_injector(down).plan = FaultPlan()
    a_again = guard(
        down, registry=CollectorRegistry(), spill_path=spill, dead_letter={"application": "app-a"}
    )
    async with a_again:
        assert await controller(a_again).drain(5) == 0
    assert await a_backend.load_memory_state("a-key") == {"owner": "app-a"}
