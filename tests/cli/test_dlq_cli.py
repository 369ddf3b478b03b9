"""``guarded dlq``: replay progress and Ctrl-C, an unreachable backend, the error of a held write."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.cli import progress as cli_progress
from guarded.cli.dlq import UNRECORDED_ERROR
from guarded.cli.support import EXIT_INTERRUPTED, EXIT_UNREACHABLE
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.deadletter import SpillFile
from guarded.guard import controller, guard
from tests.deadletter.support import buffer, event

from .support import REPO, clean_environment, closed_port, guarded, in_process

WRITES = 5_000
PROGRESS = re.compile(r"^replay: (done: )?([\d,]+) of 5,000 writes \((\d+)%\), ([\d,]+|-)/s, [\d.]+s")


def spill(path: Path, count: int = WRITES) -> None:
    """A spill file holding ``count`` events of 50 traces, as a guard leaves it after an outage."""

    async def fill() -> None:
        target = buffer(path)
        items = [
            (
                "save_event",
                (event(f"trace-{index % 50}", index),),
                {},
                None,
                f"trace-{index % 50}",
                index,
                "x",
            )
            for index in range(count)
        ]
        for start in range(0, count, 1000):
            await target.put_many(items[start : start + 1000])
        await target.aclose()

    asyncio.run(fill())


def pending(path: Path) -> int:
    reader = SpillFile.open_read_only(str(path))
    try:
        return reader.totals().pending
    finally:
        reader.close()


def test_replay_of_5000_writes_shows_progress_with_counts_and_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path)
    monkeypatch.setattr(cli_progress, "LINE_INTERVAL", 0.2)
    ran = in_process(
        capsys,
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "tests.cli.factories:memory_store",
        "--rate",
        "4000",
    )
    assert ran.code == 0, ran.err
    assert pending(path) == 0
    lines = [line for line in ran.err_lines if line.startswith("replay: ")]
    assert len(lines) >= 4, ran.err
    found = [PROGRESS.match(line) for line in lines]
    assert all(found), lines
    counts = [int(match.group(2).replace(",", "")) for match in found if match]
    assert counts == sorted(counts)
    assert any(0 < count < WRITES for count in counts), lines
    assert lines[-1].startswith("replay: done: 5,000 of 5,000 writes (100%), ")
    assert "; save_event" in lines[-1]
    rate = found[-1].group(4) if found[-1] else "-"
    assert rate != "-"
    assert int(rate.replace(",", "")) > 0
    assert ran.out.startswith(f"replayed 5000 of 5000 write(s) from 1 file(s) of {path}")


def test_ctrl_c_during_a_replay_says_what_was_done(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "guarded",
            "dlq",
            "replay",
            "--path",
            str(path),
            "--store",
            "tests.cli.factories:memory_store",
            "--rate",
            "500",
        ],
        cwd=REPO,
        env=clean_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C reaches a command run from a terminal: a suite started in the background by a
        # shell without job control hands its children SIGINT ignored, and Python keeps it so.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    timer = threading.Timer(120, process.kill)
    timer.start()
    try:
        assert process.stderr is not None
        seen: list[str] = []
        while True:  # a line every 2 s: interrupt once some writes are done
            line = process.stderr.readline()
            assert line, f"replay ended before it was interrupted: {seen}"
            seen.append(line.rstrip("\n"))
            match = PROGRESS.match(line)
            if match and int(match.group(2).replace(",", "")) > 0:
                break
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        timer.cancel()
    assert process.returncode == EXIT_INTERRUPTED, err
    last = err.strip().splitlines()[-1]
    found = re.fullmatch(
        r"interrupted: replayed ([\d,]+) of 5,000 writes in [\d.]+s \(([\d,]+)/s\) before Ctrl-C; "
        rf"([\d,]+) write\(s\) still wait in {re.escape(str(path))} \(nothing was lost\); "
        r"run 'guarded dlq replay' again to continue",
        last,
    )
    assert found, err
    replayed, left = (int(found.group(index).replace(",", "")) for index in (1, 3))
    assert 0 < replayed < WRITES
    assert left == pending(path)
    assert 0 < left <= WRITES - replayed + 200  # a bulk write in flight may be sent again next time
    assert "Traceback" not in err
    assert out == ""


def test_replay_into_an_unreachable_database_exits_3_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "dlq.sqlite"
    spill(path, 20)
    port = closed_port()
    env = clean_environment(
        GUARDED_PG_DSN=f"postgresql://app@127.0.0.1:{port}/app", GUARDED_PG_CONNECT_TIMEOUT="5"
    )
    ran = guarded(
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "guarded.backends.postgres.factory:create_store",
        env=env,
    )
    assert ran.code == EXIT_UNREACHABLE, ran.err
    assert ran.error.startswith(
        f"error: cannot reach the store's backend at postgresql://127.0.0.1:{port}/app?schema=public "
        "(from GUARDED_PG_DSN): calling 'guarded.backends.postgres.factory:create_store' failed: "
    )
    assert pending(path) == 20

    # A store that connects on first use: the replay finds the backend down, stops, and says so.
    ran = guarded(
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "guarded.backends.postgres.factory:create_store_lazy",
        "--json",
        env=env,
    )
    assert ran.code == EXIT_UNREACHABLE, ran.err
    line = ran.error_after("replay: ")
    assert line.startswith(
        f"error: the store's backend (postgresql://127.0.0.1:{port}/app?schema=public) is not answering; "
        "the replay stopped: "
    )
    assert line.endswith(
        f"20 write(s) still wait in {path} (nothing was lost); "
        "hint: bring the backend back, then run 'guarded dlq replay' again"
    )
    document = json.loads(ran.out)
    assert document["backend_down"] is True
    assert document["replayed"] == 0
    assert pending(path) == 20


class DownStore:
    """A store whose database is down: every write fails with a connection error."""

    async def save_event(self, event: Any) -> None:
        raise ConnectionRefusedError("database is down")

    async def load_history(self, trace_id: str) -> list[Any]:
        raise ConnectionRefusedError("database is down")

    async def save_remote_binding(self, binding: Any) -> None:
        raise ConnectionRefusedError("database is down")


def test_list_shows_why_a_direct_write_was_held_never_fallback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.sqlite"

    async def outage() -> None:
        store = guard(
            DownStore(),
            name="primary",
            config=GuardConfig(dead_letter=DeadLetterConfig(path=str(path), drain_timeout=0)),
            registry=CollectorRegistry(),
        )
        await store.save_event(event("trace-1", 1))
        await controller(store).aclose()

    asyncio.run(outage())
    ran = in_process(capsys, "dlq", "list", "--path", str(path), "--json")
    assert ran.code == 0, ran.err
    [entry] = json.loads(ran.out)["entries"]
    assert entry["method"] == "save_event"
    assert entry["error"] != "fallback"
    assert entry["error"] in (UNRECORDED_ERROR, "ConnectionRefusedError")
    ran = in_process(capsys, "dlq", "list", "--path", str(path))
    assert ran.code == 0
    header, row = ran.out.splitlines()[:2]
    assert header.split()[-1] == "ERROR"
    assert "fallback" not in ran.out
    assert row.endswith(entry["error"])
